"""The real-engine campaign: the paper-style trace on vLLM, resumable across machines."""
