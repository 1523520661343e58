"""Policy serving: an OpenAI-compatible server on transformers that returns token ids the way vLLM does."""
