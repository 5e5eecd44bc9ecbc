"""Engine core: the old path of the plug-in, an alias kept for one release.

`relstream.engine.plugin.relstream_scheduler` was the plug-in's `scheduler_cls` until the
engine core's code moved to `relstream.engine.core` (`tags.PLUGIN_CLASS` names the new
path); vLLM configurations written with the old one still load it. Import from
`relstream.engine.core.plugin`; this module goes in the next release.
"""

from relstream.engine.core.plugin import (
    RelstreamAsyncScheduler,
    RelstreamPlugin,
    RelstreamScheduler,
    relstream_scheduler,
    scheduler_class,
)

__all__ = [
    "RelstreamAsyncScheduler",
    "RelstreamPlugin",
    "RelstreamScheduler",
    "relstream_scheduler",
    "scheduler_class",
]
