"""Code shared by every attnstore service: chunk keys and format, settings, server
lifecycle, metrics, errors, and the client SDKs (the generated gRPC stubs live in
`attnstore.kvstore.v1`)."""
