"""The real engine: vLLM under relstream's scheduler plug-in, its weights and tokenizer."""
