"""The sustained benchmark: long traces near capacity on the simulated engine."""
