"""The `attnstore` command: run the local stack, chat with it, show its status, run the
benchmarks (see cli/README.md)."""
