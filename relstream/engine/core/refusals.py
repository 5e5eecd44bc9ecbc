"""Engine core: what the plug-in cannot honour under a policy it decides, refused
loudly rather than half done: an engine configured with it does not start, naming the
setting and the policy; a request that needs it is finished with an error at the next
step's output, as vLLM finishes a request whose grammar failed, so its client hears it,
and the log names the setting and the policy.

- `kv_transfer_config` (a KV connector: disaggregated prefill, KV loaded from elsewhere,
  and the CPU offloading `--kv-offloading-size` sets up through one).
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

import logging
from typing import Any

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

log = logging.getLogger("relstream.plugin")


def config_conflict(policy: str, vllm_config: Any) -> str | None:
    """Why the engine cannot start with `vllm_config` under `policy` (None: it can)."""
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        return (
            f"kv_transfer_config (a KV connector, or KV offloading through one) is not "
            f"supported under policy {policy!r}, which plans every step itself: its loading "
            "requests would wedge the plan. Use policy 'v1-fcfs' or 'v1-priority' with a KV "
            "connector or KV offloading, or remove it"
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


class Refused:
    """Requests refused on arrival (`request_conflict`), each finished with an error at
    the next step's output, the way vLLM reports its own errors to the request's client."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.ids: list[str] = []

    def check(self, request: Any) -> bool:
        """Whether `request` is refused (then logged, and finished at the next output)."""
        reason = request_conflict(self.policy, request)
        if reason:
            log.error("%s", reason)
            self.ids.append(request.request_id)
        return reason is not None

    def finish(self, scheduler: Any, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Finish the refused requests in `scheduler`, their outputs added to `outputs`."""
        if not self.ids:
            return
        ids, self.ids = self.ids, []
        for request in scheduler.finish_requests(ids, RequestStatus.FINISHED_ERROR):
            output = EngineCoreOutput(
                request_id=request.request_id, new_token_ids=[],
                finish_reason=request.get_finished_reason(),
            )  # fmt: skip
            outputs.setdefault(request.client_index, EngineCoreOutputs()).outputs.append(output)
