"""Both processes: the real engine, vLLM under relstream's scheduler plug-in.

Two processes run this package's code: the service's (`runtime`, its requests, twins and
answers, the model's weights, identity and tokenizer, CPU settings, child lifetimes) and
vLLM's engine core (`core/`: the plug-in). `tags` is what both agree on, the only module
both import; docs/architecture/engine.md's engine module map says which runs where.
"""
