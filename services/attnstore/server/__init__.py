"""gRPC server plumbing shared by the services: lifecycle, interceptors, logging, metrics."""
