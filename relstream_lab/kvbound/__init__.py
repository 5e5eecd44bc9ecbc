"""`relstream-lab bench kv-bound`: long outputs where KV binds, in the simulator."""
