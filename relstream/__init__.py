"""relstream: low-latency LLM queries over tables (RelServe scheduling on vLLM)."""

__version__ = "0.1.0"
