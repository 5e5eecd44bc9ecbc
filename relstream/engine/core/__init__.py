"""Engine core: the code vLLM runs in its engine core process, the scheduler plug-in.

vLLM loads `core.plugin` there by its dotted path (`engine/tags.py`, `PLUGIN_CLASS`);
with it come its waiting queue (`core.waitqueue`) and its load file's writer
(`core.loadwriter`). `core.harness` stands the same code up in a test's own process.
Nothing here imports the service's side of `relstream.engine`, nor it this: both import
only `engine/tags.py`, what the two processes agree on.
"""
