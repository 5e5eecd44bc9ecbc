"""The placement benchmark: hash against load-aware placement over simulated engines."""
