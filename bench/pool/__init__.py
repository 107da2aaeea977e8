"""The pool benchmark (issue 21): the daemon's data plane against gRPC, Redis and the
loopback socket limit."""
