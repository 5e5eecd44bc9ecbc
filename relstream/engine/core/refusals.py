"""What the plug-in cannot honour under a policy it decides, refused loudly rather than
half done: an engine configured with it does not start, naming the setting and the
policy; a request that needs it is aborted with an error in the log, naming both.

- `kv_transfer_config` (a KV connector: disaggregated prefill, KV loaded from elsewhere).
  vLLM keeps a loading request in its own queue and drains loading and loaded requests
  first; a plan admits by rank and charges a loading request's whole sequence as if it
  held no blocks, so one load can stop every later plan on KV (vLLM's own
  `test_async_load_reservation_prevents_wedge_e2e`: nothing runs in 80 steps).
- Streaming input (a resumable request): each continuation arrives under the session's
  known id, which the plan has no row for, so the session would hang counted as running.

Under the policies vLLM decides itself (`v1-fcfs`, `v1-priority`) both work as in
stock vLLM: the plug-in only observes.
"""

from __future__ import annotations

from typing import Any


def config_conflict(policy: str, vllm_config: Any) -> str | None:
    """Why the engine cannot start with `vllm_config` under `policy` (None: it can)."""
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        return (
            f"kv_transfer_config (a KV connector) is not supported under policy {policy!r}, "
            "which plans every step itself: its loading requests would wedge the plan. "
            "Use policy 'v1-fcfs' or 'v1-priority' with a KV connector, or remove it"
        )
    return None


def request_conflict(policy: str, request: Any) -> str | None:
    """Why `request` cannot be served under `policy` (None: it can)."""
    if getattr(request, "resumable", False):
        return (
            f"request {request.request_id!r}: streaming input (a resumable request) is not "
            f"supported under policy {policy!r}; its continuations would never be planned. "
            "Use policy 'v1-fcfs' or 'v1-priority' for streaming-input sessions"
        )
    return None
