"""The input rows of relQueries, read from the relqueries topic as results ask for them:
what `relstream sink --with-input` adds to each stored row (`connectors.sinks`).

Results carry each row's key and answer, not its input values; the relQuery the engine
answered carries them, and is already on the relqueries topic. `RelQueryInputs` reads that
topic (joining no consumer group) as far as a result needs: from where it stopped to the
topic's ends now, keeping each relQuery's rows by id until a result takes them. Nothing is
added to the results on the wire. A relQuery no longer on the topic (retention deleted
it) gives no input values.
"""

from __future__ import annotations

from relstream.kafka.clients.bounds import Span, extents, partitions
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.sync import sync_consumer
from relstream.wire import MessageError, RelQueryMessage, decode
from relstream.wire.messages import RelQueryRow


class RelQueryInputs:
    """The rows of relQueries on `topic`, read as results ask for them."""

    def __init__(self, bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT) -> None:
        self.topic = topic
        self._consumer = sync_consumer(bootstrap, security=security, enable_auto_commit=False)
        self._next: dict = {}  # partition -> the next offset to read
        self._rows: dict[str, list[RelQueryRow]] = {}

    def rows(self, relquery_id: str) -> list[RelQueryRow] | None:
        """The input rows of relQuery `relquery_id`, read up to the topic's ends if not
        read yet; None when it is not on the topic. Each is handed out once."""
        if relquery_id not in self._rows:
            self._read_to_end()
        return self._rows.pop(relquery_id, None)

    def _read_to_end(self) -> None:
        found = extents(self._consumer, partitions(self._consumer, [self.topic]))
        bounds = {p: (max(self._next.get(p, e.start), e.start), e.end) for p, e in found.items()}
        for record in Span(self._consumer, bounds, None):
            try:
                message = decode(RelQueryMessage, record.value)
            except MessageError:  # another program's message: no rows to give
                continue
            self._rows[message.id] = message.rows
        self._next.update({p: end for p, (_, end) in bounds.items()})

    def close(self) -> None:
        self._consumer.close()
