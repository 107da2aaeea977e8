"""attnstore inference worker: runs the model, reuses KV from its node's daemon, saves new KV."""
