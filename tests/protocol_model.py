"""The model of Kafka and the glue that tests/kafka/test_protocol.py drives (its docstring
says what each part mirrors); imported by that module only.

`Kafka`: one rows partition, one relqueries partition; a group's committed offset and
metadata per group; a transactional id per input partition (the worker's, the engine's)
whose epoch fences older producers, with one open transaction each that commits
atomically (its records and its group's offset) or aborts, its records visible only once
committed (read_committed: a reader stops at an open one's first record, skips aborted
ones). Faults, drawn by the state machine: a message refused for good; a send or
transaction that times out (a lost ack: appended twice without transactions, relstream's
plain producers not being idempotent; a transaction renewed and redone); a broker that
restarts EMPTY (`wipe`: every log, commit and transaction gone, offsets from 0 again;
the clock goes on, so ids, which carry the first row's timestamp, differ) or KEEPING its
data but forgetting which partitions each open transaction wrote (`restart_keeping`, as
noida-db does: committed after that, the offset commit counts and the records stay
invisible for good; a batch resent into such a transaction after the restart gets no
marker, and holds readers back until the broker's look for hanging transactions aborts
it, `kafka/delivery/hanging.py`, unless its producer names the partitions again before it aborts,
`txprobe._announce_again`); each restart breaks every producer's
connection (`restarts`), and so does a reset after a commit the broker took (its answer
lost: the outcome is found out from the broker's record, `kafka/delivery/outcome.py`, and only
records it cannot show are redone); re-delivery (a consumer re-reads from the committed
offset); consumers killed at any step (an open transaction left for the next owner's
fencing to abort, work in flight lost) or rebalanced to the other engine, knowingly
(revoked) or not (a zombie that still believes it owns the partition).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from relstream.model import Template
from relstream.service.offsets import OffsetBook, decode_ahead, encode_ahead
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import ENVELOPE_BYTES, PartitionWindows, RowRejection
from relstream.wire import RowMessage, encode

REGISTRATION = QueryRegistration("q", "t", Template("{x}"), window_seconds=2.0, max_rows=3)
# Room for about 70 bytes of rows: windows are cut by bytes too, and a row of ~90 is refused.
MESSAGE_BYTES = ENVELOPE_BYTES + 170 + 70
LATENESS = 1.0
P = "relqueries-0"  # the engine's input partition (one)
WORKER_GROUP, ENGINE_GROUP = "worker", "engine"  # also their partitions' transactional ids


@dataclass(eq=False)
class Txn:
    state: str = "open"  # open, committed, aborted
    records: list[Record] = field(default_factory=list)
    forgotten: bool = False  # a restart forgot which partitions it wrote (noida-db)


@dataclass(eq=False)
class Record:
    value: object
    txn: Txn | None = None  # None: not transactional, visible once appended
    lost: bool = False  # its transaction's partition forgotten by a restart: never visible
    late: bool = False  # appended to its transaction after a restart forgot it
    dangling: bool = False  # late, and no marker reached it: pending for good
    ended: bool = False  # late, aborted by the broker's look for hanging ones

    @property
    def visible(self) -> bool:  # to a read_committed reader
        if self.lost or self.dangling or self.ended:
            return False
        return self.txn is None or self.txn.state == "committed"

    @property
    def pending(self) -> bool:  # holds a read_committed reader back (the last stable offset)
        if self.lost or self.ended:
            return False
        return self.dangling or (self.txn is not None and self.txn.state == "open")


class Kafka:
    """The broker's state; `wipe` is a restart with nothing kept, `restart_keeping` one
    that keeps the logs and commits but not the open transactions' partitions."""

    def __init__(self) -> None:
        self.incarnation = 0
        self.restarts = 0  # every restart breaks every producer's connection
        self.seen_results: Counter = Counter()  # a read_committed reader, across restarts
        self.epochs = {WORKER_GROUP: 0, ENGINE_GROUP: 0}  # each transactional id's latest
        self.open: dict[str, Txn] = {}  # each transactional id's open transaction
        self.wipe()

    def wipe(self) -> None:
        self.incarnation += 1
        self.restarts += 1
        self.rows: list[Record] = []  # value: (row identity, raw bytes, timestamp s)
        self.relqueries: list[Record] = []  # value: (id, row identities)
        self.results: list[Record] = []  # value: relQuery id
        self.letters: list[Record] = []  # value: ("row", identity) or ("rq", id)
        self.commits: dict[str, tuple[int, str]] = {}
        for txn in self.open.values():
            txn.state = "aborted"
        self.open.clear()

    def restart_keeping(self) -> None:
        self.restarts += 1
        for txn in self.open.values():
            txn.forgotten = True
            for record in txn.records:
                record.lost = True

    def init_producer(self, tid: str, announced: bool = False) -> int:
        """InitProducerId for `tid`: aborts its open transaction, fences every older
        producer, returns the new epoch. A record appended after a restart forgot its
        transaction gets no abort marker (pending for good) unless the producer that
        wrote it `announced` its partitions again before the abort
        (`txprobe._announce_again`)."""
        txn = self.open.pop(tid, None)
        if txn is not None:
            txn.state = "aborted"
            for record in txn.records:
                record.dangling = record.late and not announced
        self.epochs[tid] += 1
        return self.epochs[tid]

    def begin(self, tid: str) -> Txn:
        txn = self.open[tid] = Txn()
        return txn

    def append(self, log: list[Record], value, txn: Txn | None = None) -> Record:
        record = Record(value, txn, late=txn is not None and txn.forgotten)
        log.append(record)
        if txn is not None:
            txn.records.append(record)
        return record

    def abort(self, tid: str, txn: Txn) -> None:
        """EndTxn(abort): the transaction's records are never visible."""
        txn.state = "aborted"
        self.open.pop(tid, None)
        for record in txn.records:  # the abort's markers miss them too
            record.dangling = record.late

    def commit(self, tid: str, txn: Txn, mark: tuple[int, str]) -> None:
        """The transaction's offset commit (its group is its id) and its records."""
        self.commits[tid] = mark
        txn.state = "committed"
        self.open.pop(tid, None)
        for record in txn.records:  # the commit's markers miss them too
            record.dangling = record.late

    def end_hanging(self) -> None:
        """The embedded broker's look (`kafka/delivery/hanging.py`): a record that holds readers
        back in a transaction no coordinator knows (late: appended after a restart forgot
        its transaction) is aborted, whoever wrote it."""
        for log in (self.rows, self.relqueries, self.results, self.letters):
            for record in log:
                if record.late and record.pending:
                    record.dangling, record.ended = False, True

    def visible(self, log: list[Record]) -> list:
        return [r.value for r in log if r.visible]


@dataclass
class Worker:
    """One worker process's stage state (`WindowStage`) for the one rows partition."""

    published: dict[tuple[int, int], int] = field(default_factory=dict)  # `_published[p]`
    cutter: PartitionWindows | None = None  # `_cutters[partition]`; None: not assigned
    position: int = 0
    # `WindowCommits`: the letters held back (`_held`: offset, identity); exactly once,
    # the partition's producer epoch and the offset last committed (`_committed`).
    producer: int | None = None
    held: list[tuple[int, tuple]] = field(default_factory=list)
    committed: int | None = None


@dataclass
class Engine:
    """One engine process's state for the one relqueries partition."""

    book: OffsetBook = field(default_factory=OffsetBook)
    owns: bool = False  # as the engine believes (its consumer's assignment)
    producer: int | None = None  # its transactional producer's epoch; None: closed
    skip: frozenset = frozenset()  # `ExactlyOnce._skip[partition]`
    position: int = 0
    serving: list[int] = field(default_factory=list)  # offsets being answered, any order
    leases: dict[int, int] = field(default_factory=dict)  # each one's (`OffsetBook.start`)
    locked: int | None = None  # the offset whose transaction holds the partition's lock
    txn: Txn | None = None  # that transaction, once begun
    before: int = 0  # `_once`'s `breaks()` when it began (the broker's restarts)
    answer: str = ""  # what that transaction carries: "result" or "letter"
    # The group's mark as it last knew it (`PartitionProducers._known`), and whether its
    # next try checks it first, having renewed its producer after a failure
    known: tuple | None = None
    verify: bool = False
    # What each served offset is: the relQuery id read there.
    ids: dict[int, str] = field(default_factory=dict)


def row(n: int, kind: str) -> bytes:
    if kind == "garbage":
        return b"\xc1not msgpack"
    size = {"small": 3, "large": 30, "huge": 90}[kind]
    return encode(RowMessage(table="t", key=f"r{n}", values={"x": "y" * size}))


class Model:
    """The glue: the order of calls the real code makes, over `Kafka`. Flags: the faults
    and defences a state machine turns on or off."""

    TRANSACTIONS = True  # the worker exactly once (`Transacted`); False: at least once
    DEFENCE = True  # `_once`'s BrokerLost: a transaction whose connection broke is redone
    ZOMBIES = True  # an engine rebalanced away without knowing it
    KILLED_BEFORE_REDO = True  # killed between a commit a restart cut and its redo
    # A commit sent once a connection broke goes as an abort (`txfaults.Breaks`); False:
    # as before, committed by the restarted broker with its records lost.
    COMMIT_UNBROKEN = True
    # A producer names its transaction's partitions again before it aborts
    # (`txprobe._announce_again`); False: as before, a batch resent after a restart pins.
    ANNOUNCE_AGAIN = True
    KILLED_WITH_A_LATE_BATCH = True  # killed after a batch resent past a restart
    # The embedded broker aborts transactions no coordinator knows (`kafka/delivery/hanging.py`);
    # False: as before, a batch resent after a restart by a writer then killed pins.
    END_HANGING = True
    CHECK_OURS = True  # a renewed producer checks the group's mark first; False: as before
    # A window closed by the clock while rows of it are still to be read: the product
    # closes one only once read to the end (stage.py `_read_to_end`); True: as before.
    EXPIRES_BEHIND = False

    def __init__(self) -> None:
        self.kafka = Kafka()
        self.clock = 1_000.0  # seconds; strictly increasing per row (ids never repeat)
        self.produced = 0
        self.worker: Worker | None = Worker()
        self.engines: list[Engine | None] = [Engine(), Engine()]
        self.identities: dict[str, tuple[int, int]] = {}  # row key -> (incarnation, offset)
        self.faults = True
        self.owner = 0  # which engine the group gave the partition
        self._assign(self.engines[0])

    # --- the worker, both ways (stage.py `_step`) ------------------------------------
    def _read(self, worker: Worker, n: int):
        """Read up to `n` rows, cut them, expire: the closed windows and the rejected rows
        (offset, identity)."""
        cutter = worker.cutter
        records = [r.value for r in self.kafka.rows[worker.position : worker.position + n]]
        closed, rejected = [], []
        for offset, (identity, raw, stamp) in enumerate(records, start=worker.position):
            checked = cutter.check(raw)
            row = size = None
            if isinstance(checked, RowRejection):
                rejected.append((offset, identity))
            else:
                row, size = checked
            closed += cutter.add(offset, stamp, row, size)
            if row is not None:
                self.identities[row.key] = identity
        worker.position += len(records)
        if self.EXPIRES_BEHIND or worker.position == len(self.kafka.rows):
            expired = cutter.expire(self.clock, LATENESS)
            if expired is not None:
                closed.append(expired)
        return closed, rejected

    def _relquery(self, window) -> tuple[str, tuple]:
        return window.window_id("q").format(), tuple(self.identities[r.key] for r in window.rows)

    def _worker_poll(self, n, outcomes, dies=False, commit_fails=False, cut=None):
        if self.worker is None:
            return
        if self.TRANSACTIONS:
            self._worker_transacted(n, list(outcomes), dies, cut)
        else:
            self._worker_acked(n, list(outcomes), dies, commit_fails)

    def _worker_acked(self, n, outcomes, dies, commit_fails):
        """At least once: `_deliver` (`WindowCommits.commit` over `Acked`: the windows
        and the held letters the commit passes, each sent until acknowledged),
        `published`, `_commit`."""
        worker, kafka = self.worker, self.kafka
        if worker.cutter is None:  # assigned: read from the group's commit
            worker.position = kafka.commits.get(WORKER_GROUP, (0, ""))[0]
            worker.cutter = PartitionWindows(REGISTRATION, 0, worker.published, MESSAGE_BYTES)
        closed, rejected = self._read(worker, n)
        worker.held += rejected
        offset, letters = worker.cutter.committable(), []
        if offset is not None:  # None: nothing read yet, nothing to deliver
            letters = [("row", identity) for at, identity in worker.held if at < offset]
            worker.held = [(at, identity) for at, identity in worker.held if at >= offset]
        for window in closed:
            if worker.published.get(window.start) == window.last_offset:
                continue  # "replayed as published, not sent again"
            relquery = self._relquery(window)
            outcome = (outcomes.pop(0) if outcomes else "ack") if self.faults else "ack"
            if outcome == "refused":  # `Part.instead`: its rows' letters
                letters += [("row", identity) for identity in relquery[1]]
                continue
            for _ in range(2 if outcome == "dup" else 1):
                kafka.append(kafka.relqueries, relquery)
        for letter in letters:
            kafka.append(kafka.letters, letter)
        for window in closed:
            worker.published[window.start] = window.last_offset
        if dies:
            self.worker = None
            return
        if offset is not None and not commit_fails:  # `_commit` (a refusal is logged)
            kafka.commits[WORKER_GROUP] = (offset, "")
            for start in [start for start in worker.published if start[0] < offset]:
                del worker.published[start]

    def _worker_transacted(self, n, outcomes, dies, cut):
        """Exactly once: `_assigned` (`take_over`), `_step` holding rejected rows' letters
        (`WindowCommits.hold`), `_deliver`/`commit_all`/`WindowCommits.commit`
        (the windows' parts and the held letters the commit passes, nothing if nothing
        new), then `transact`'s loop around `_once`."""
        worker, kafka = self.worker, self.kafka
        if worker.cutter is None:  # `take_over`: fence (open the producer), read, seek
            worker.producer = kafka.init_producer(WORKER_GROUP)
            worker.position = kafka.commits.get(WORKER_GROUP, (0, ""))[0]
            worker.cutter = PartitionWindows(REGISTRATION, 0, {}, MESSAGE_BYTES)
        closed, rejected = self._read(worker, n)
        worker.held += rejected
        offset = worker.cutter.committable()
        if offset is None:
            return
        passed = [("letters", ("row", identity)) for at, identity in worker.held if at < offset]
        if not closed and not passed and worker.committed == offset:
            return
        parts = [("relqueries", self._relquery(window)) for window in closed] + passed
        while True:
            txn, before = kafka.begin(WORKER_GROUP), kafka.restarts
            outcome = (outcomes.pop(0) if outcomes else "ack") if self.faults else "ack"
            late = False
            for i, (log, value) in enumerate(parts):
                if cut == "mid" and i == 1:  # the rest resent once the broker is back
                    kafka.restart_keeping()
                    cut, late = None, True
                kafka.append(getattr(kafka, log), value, txn)
            renew = lambda: kafka.init_producer(WORKER_GROUP, self.ANNOUNCE_AGAIN)  # noqa: E731
            refused = [i for i, (log, _) in enumerate(parts) if log == "relqueries"]
            if outcome == "refused" and refused:  # `Refused`: renewed, `replaced`
                i = refused[0]
                letters = [("letters", ("row", identity)) for identity in parts[i][1][1]]
                parts = parts[:i] + letters + parts[i + 1 :]
                worker.producer = renew()
                continue
            if outcome == "dup":  # an ack lost, the transaction timed out: `_renew`d
                worker.producer = renew()
                continue
            if cut == "sending":
                kafka.restart_keeping()
                cut = None
            if dies and (not late or self.KILLED_WITH_A_LATE_BATCH):  # killed before its
                self.worker = None  # commit: the transaction left open
                return
            if self.DEFENCE and kafka.restarts != before:  # BrokerLost before the commit
                worker.producer = renew()
                continue
            if cut == "before":
                kafka.restart_keeping()
                cut = None
                if self.COMMIT_UNBROKEN:  # sent as an abort; found out: redone whole
                    kafka.abort(WORKER_GROUP, txn)
                    if self.KILLED_BEFORE_REDO and self.faults:
                        self.worker = None
                        return
                    worker.producer = renew()
                    continue
            kafka.commit(WORKER_GROUP, txn, (offset, ""))
            cut = self._after_commit(cut)
            if self.DEFENCE and kafka.restarts != before:  # `Unanswered`: found out
                if self.KILLED_BEFORE_REDO and self.faults:
                    self.worker = None
                    return
                worker.producer = renew()  # `_settle` renews
                # `find_outcome`: the mark is the group's (the commit landed); only the
                # records a read_committed reader cannot see are sent again, same mark
                lost = [part for part, r in zip(parts, txn.records, strict=True) if not r.visible]
                if lost:
                    parts = lost
                    continue
            break
        worker.committed = offset
        worker.held = [(at, identity) for at, identity in worker.held if at >= offset]

    def _after_commit(self, cut):
        """What happens to the connections once the broker took a commit: a restart
        keeping the data ("after"), or a reset ("reset": the answer lost, nothing else);
        each breaks the producer's connection. None: the cut is spent."""
        if cut == "after":
            self.kafka.restart_keeping()
        elif cut == "reset":
            self.kafka.restarts += 1  # a broken connection, the broker as it was
        return None if cut in ("after", "reset") else cut

    def _forget_worker(self) -> None:
        """`_forget`: the cutter goes and `WindowCommits.forget` (at least once:
        `_published` stays; exactly once: the producer closed)."""
        worker = self.worker
        if worker is not None:
            worker.cutter = worker.producer = worker.committed = None
            worker.held = []

    # --- the engines (service.py, commits.py, transactions.py) ------------------------
    def _revoke(self, engine: Engine) -> None:
        """`_on_revoked`: `ExactlyOnce.revoked` closes the producer (a transaction still
        waiting is left open, for the next owner's fencing to abort), then the book
        forgets the partition and its work in flight is fenced."""
        engine.producer = None
        engine.skip = frozenset()
        engine.book.forget([P])
        engine.owns = False
        engine.serving.clear()
        engine.locked = engine.txn = None

    def _assign(self, engine: Engine) -> None:
        """`ExactlyOnce.assigned`: fence (open the producer), then read the commit."""
        kafka = self.kafka
        engine.owns = True
        engine.producer = kafka.init_producer(ENGINE_GROUP)
        mark = engine.known = kafka.commits.get(ENGINE_GROUP)
        engine.verify = False
        if mark is None:
            engine.position, engine.skip = 0, frozenset()
        else:
            engine.position, engine.skip = mark[0], decode_ahead(mark[1], mark[0])

    def _engine_fetch(self, which, n):
        """`_poll_once` over a read_committed fetch: up to the first record of an open
        transaction, aborted or lost records skipped."""
        engine = self.engines[which]
        if engine is None or not engine.owns:
            return
        log = self.kafka.relqueries
        if engine.position > len(log):  # out of range: auto_offset_reset="earliest"
            engine.position = 0
        end = min(engine.position + n, len(log))
        end = next((o for o in range(engine.position, end) if log[o].pending), end)
        for offset in range(engine.position, end):
            if not log[offset].visible:
                continue
            engine.leases[offset] = engine.book.start(P, offset)
            if offset in engine.skip:  # `replayed`: answered by a committed transaction
                engine.book.finish(P, offset, engine.leases[offset])
                continue
            engine.ids[offset] = log[offset].value[0]
            engine.serving.append(offset)
        engine.position = end

    def _engine_begin(self, which, pick, letter):
        engine = self.engines[which]
        if engine is None or not engine.serving or engine.txn is not None:
            return
        if engine.locked is not None:  # a retry: the same work, the lock still held
            offset = engine.locked
        else:
            offset = engine.serving[pick % len(engine.serving)]
            # `_room`: a closed producer goes on to `transact`, which raises Fenced
            if engine.producer is not None and not engine.book.may_finish(P, offset, 0):
                return  # waits for the prefix to move
        if engine.producer is None:  # `transact`: Fenced, the work left to the new owner
            engine.serving.remove(offset)
            engine.locked = None
            return
        if engine.producer != self.kafka.epochs[ENGINE_GROUP]:  # ProducerFenced
            self._fenced(engine, offset)
            return
        if engine.verify and self.CHECK_OURS:  # `_check_ours`: another owner committed?
            engine.verify = False
            if self.kafka.commits.get(ENGINE_GROUP) != engine.known:
                self._fenced(engine, offset)
                return
        engine.locked, engine.answer = offset, "letter" if letter else "result"
        engine.txn, engine.before = self.kafka.begin(ENGINE_GROUP), self.kafka.restarts
        relquery_id = engine.ids[offset]
        if letter:  # the relQuery failed, or its result was refused: its dead letter
            self.kafka.append(self.kafka.letters, ("rq", relquery_id), engine.txn)
        else:
            self.kafka.append(self.kafka.results, relquery_id, engine.txn)

    def _fenced(self, engine: Engine, offset: int) -> None:
        """`transact` on ProducerFenced: `_drop`, the work Fenced; a partition still
        assigned (as the engine believes) makes it ask its group (`on_fenced`,
        `rejoin`): revoked, then assigned again if the group still has it here (fenced
        anew, read from its commit), so a zombie learns and an owner resumes."""
        engine.producer = None
        engine.serving.remove(offset)
        engine.locked = None
        if engine.owns:
            self._revoke(engine)
            if self.owner == self.engines.index(engine):
                self._assign(engine)

    def _engine_commit(self, which, times_out, cut=None):
        engine = self.engines[which]
        if engine is None or engine.txn is None:
            return
        kafka, offset, txn = self.kafka, engine.locked, engine.txn
        lost = self.DEFENCE and kafka.restarts != engine.before  # BrokerLost before it
        if (times_out and self.faults) or lost:  # `_renew`: a new producer aborts it
            engine.txn = None  # the lock stays held: `engine_begin` retries it
            engine.producer = kafka.init_producer(ENGINE_GROUP) if engine.owns else None
            engine.verify = True
            return  # (an outage answers before any fencing can)
        if engine.producer != kafka.epochs[ENGINE_GROUP] or txn.state != "open":
            engine.txn = None
            self._fenced(engine, offset)
            return
        if not engine.book.unfinished(P, offset, engine.leases[offset]):  # `_at`: Fenced
            txn.state = "aborted"
            kafka.open.pop(ENGINE_GROUP, None)
            engine.serving.remove(offset)
            engine.locked = engine.txn = None
            return
        first, ahead = engine.book.progress(P, offset)
        if cut == "before":
            kafka.restart_keeping()
            if self.COMMIT_UNBROKEN:  # sent as an abort; found out: redone whole
                kafka.abort(ENGINE_GROUP, txn)
                engine.txn = None  # the lock stays held: `engine_begin` redoes it
                if self.KILLED_BEFORE_REDO and self.faults:
                    self.engines[which] = None
                    return
                engine.producer = kafka.init_producer(ENGINE_GROUP)  # `_settle` renews
                return
        engine.known = (first, encode_ahead(ahead, first))
        kafka.commit(ENGINE_GROUP, txn, engine.known)
        self._after_commit(cut)
        if engine.answer == "result" and txn.records[0].visible:
            kafka.seen_results[engine.ids[offset]] += 1
        if self.DEFENCE and kafka.restarts != engine.before:  # `Unanswered`: found out
            engine.txn = None
            if self.KILLED_BEFORE_REDO and self.faults:
                self.engines[which] = None
                return
            engine.producer = kafka.init_producer(ENGINE_GROUP)  # `_settle` renews
            if not txn.records[0].visible:  # lost with a restart: sent again, same mark
                self._engine_begin(which, 0, engine.answer == "letter")
                self._engine_commit(which, False)
                return
        engine.book.finish(P, offset, engine.leases[offset])
        engine.book.committable([P])
        engine.serving.remove(offset)
        engine.locked = engine.txn = None
