"""What the HTTP door holds at once, and which ids it takes (docs/serving.md, "Over HTTP").

A request holds a place from the moment it arrives until its client is answered (or has
gone): its relQuery, served here or forwarded, its rows and its body's bytes. Past any of
the three bounds (`DoorLimits`, `relstream serve --http-max-*`) it is a 429 with
`Retry-After`; a relQuery larger on its own than a bound could never fit, a 413. So the
door holds at most that many relQueries, rows and body bytes, whatever its clients send,
and a client told to come back later is told at once, before its body is read where the
relQuery bound is reached.

A relQuery id is claimed by one request at a time, at once (a second request under it is
a 409 however the two interleave), and an id in the worker's window form,
`<query>-<partition>-<offset>@<ms>` (`stream/windowing.py`), is the worker's: refused, so
that a door's relQuery never shares its id, on the results topic or in the engine, with
a window's.
"""

from __future__ import annotations

from dataclasses import dataclass

from relstream.wire.windowid import WindowId

MAX_RELQUERIES = 1000  # relQueries one door holds at once, served here or forwarded
MAX_ROWS = 200_000  # their rows: two of the largest relQueries (MAX_RELQUERY_ROWS)
MAX_BODY_MIB = 256  # their request bodies
RETRY_AFTER_S = 1  # what a 429 tells its client to wait, in seconds



@dataclass(frozen=True)
class DoorLimits:
    relqueries: int = MAX_RELQUERIES
    rows: int = MAX_ROWS
    body_bytes: int = MAX_BODY_MIB << 20


class HttpError(Exception):
    """A request the door does not answer: its HTTP `status`, why, and for a 429 the
    seconds to wait before trying again."""

    def __init__(self, status: int, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


def is_window_id(relquery_id: str) -> bool:
    """Whether `relquery_id` has the form of a worker's window id."""
    return WindowId.parse(relquery_id) is not None


class DoorAdmission:
    """The places the door's requests hold, against `limits`; `enter()` takes one."""

    def __init__(self, limits: DoorLimits) -> None:
        self.limits = limits
        self.relqueries = 0
        self.rows = 0
        self.body_bytes = 0
        self._ids: set[str] = set()

    def __contains__(self, relquery_id: str) -> bool:
        return relquery_id in self._ids

    def enter(self) -> Ticket:
        """A place for one more request, or a 429 if the door holds its most."""
        if self.relqueries >= self.limits.relqueries:
            raise self.busy(f"{self.relqueries} relQueries")
        self.relqueries += 1
        return Ticket(self)

    def busy(self, what: str) -> HttpError:
        return HttpError(429, f"the door holds {what}, its most; try again later", RETRY_AFTER_S)


class Ticket:
    """One request's place: what it holds, given back by `release()` (once)."""

    def __init__(self, admission: DoorAdmission) -> None:
        self._admission = admission
        self.rows = 0
        self.body_bytes = 0
        self.relquery_id: str | None = None
        self._held = True

    def hold_bytes(self, total: int) -> None:
        """Hold `total` bytes of its body (what arrived so far, or what it declares)."""
        admission, limit = self._admission, self._admission.limits.body_bytes
        more = total - self.body_bytes
        if more <= 0:
            return
        if total > limit:
            raise HttpError(413, f"body is over the door's bound of {limit} bytes")
        if admission.body_bytes + more > limit:
            raise admission.busy(f"{admission.body_bytes} bytes of bodies")
        admission.body_bytes += more
        self.body_bytes = total

    def hold_rows(self, rows: int) -> None:
        admission, limit = self._admission, self._admission.limits.rows
        if rows > limit:
            raise HttpError(413, f"{rows} rows; the door holds at most {limit}")
        if admission.rows + rows > limit:
            raise admission.busy(f"{admission.rows} rows")
        admission.rows += rows
        self.rows += rows

    def claim(self, relquery_id: str) -> None:
        """Take `relquery_id` for this request: a 409 if another holds it, a 400 if it
        is in the worker's form."""
        if is_window_id(relquery_id):
            raise HttpError(
                400,
                f"field id: {relquery_id!r} has the form of a worker's window id "
                "(<query>-<partition>-<offset>@<ms>), kept for the worker; choose another",
            )
        if relquery_id in self._admission:
            raise HttpError(409, f"relQuery {relquery_id!r} is already being served")
        self._admission._ids.add(relquery_id)
        self.relquery_id = relquery_id

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        admission = self._admission
        admission.relqueries -= 1
        admission.rows -= self.rows
        admission.body_bytes -= self.body_bytes
        if self.relquery_id is not None:
            admission._ids.discard(self.relquery_id)
