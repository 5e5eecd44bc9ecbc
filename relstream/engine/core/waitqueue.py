"""Engine core: vLLM's FCFS waiting queue with removal in O(requests removed).

The plug-in takes each step's admissions out of vLLM's waiting queue (`plugin`), and
vLLM's own FCFSRequestQueue removes by rebuilding itself, a cost that grows with the
whole queue every step (measured in docs/architecture/engine.md, "What vLLM V1 does each
step"). This queue keeps the same order under the same operations (append,
prepend, pop and peek at the front, remove anywhere) in an insertion-ordered dict, so a
removal costs what it removes. A request is in it at most once, as in vLLM's queues.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request


class IndexedWaitingQueue(RequestQueue):
    """First come, first served, as vLLM's FCFSRequestQueue; removal by request O(1)."""

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._requests: OrderedDict[Request, None] = OrderedDict.fromkeys(requests)

    def add_request(self, request: Request) -> None:
        self._requests[request] = None

    def pop_request(self) -> Request:
        if not self._requests:
            raise IndexError("pop from an empty queue")
        return self._requests.popitem(last=False)[0]

    def peek_request(self) -> Request:
        if not self._requests:
            raise IndexError("peek from an empty queue")
        return next(iter(self._requests))

    def prepend_request(self, request: Request) -> None:
        self._requests[request] = None
        self._requests.move_to_end(request, last=False)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Each in turn to the front, so they end up in reverse order (deque.extendleft),
        as vLLM's queue does."""
        for request in requests:
            self.prepend_request(request)

    def remove_request(self, request: Request) -> None:
        try:
            del self._requests[request]
        except KeyError:
            raise ValueError("request not in the queue") from None

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Those of `requests` that wait; the others are ignored, as vLLM's queue does."""
        for request in requests:
            self._requests.pop(request, None)

    def __bool__(self) -> bool:
        return bool(self._requests)

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)
