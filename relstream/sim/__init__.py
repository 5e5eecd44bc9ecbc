"""The simulated engine: step costs, the KV/prefix cache, and the sim backend."""
