"""`relstream-lab bench gpu-steps`: a model's step costs timed on an accelerator."""
