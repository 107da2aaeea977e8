"""Prompt modules (Prompt Cache) in the worker: encode a module's KV, serve a prompt from it."""
