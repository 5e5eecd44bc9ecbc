"""Every kind of message on the wire, by its `kind` name: what the JSON Schemas are
generated for and the codec and the tests go through."""

from __future__ import annotations

from relstream.wire.letters import DeadLetterMessage, ReplayedMessage
from relstream.wire.messages import (
    AnswerMessage,
    ControlMessage,
    LoadReportMessage,
    Message,
    MetricsMessage,
    PartialResultMessage,
    RelQueryMessage,
    ResultMessage,
    RowMessage,
)

MESSAGE_TYPES: tuple[type[Message], ...] = (
    RowMessage,
    RelQueryMessage,
    ResultMessage,
    PartialResultMessage,
    MetricsMessage,
    DeadLetterMessage,
    ControlMessage,
    AnswerMessage,
    LoadReportMessage,
    ReplayedMessage,
)
KINDS: dict[str, type[Message]] = {t.kind: t for t in MESSAGE_TYPES}
