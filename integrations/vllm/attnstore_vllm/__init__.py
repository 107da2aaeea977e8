"""attnstore for vLLM: `attnstore_vllm.connector.AttnStoreConnector`, a vLLM V1 KV connector."""
