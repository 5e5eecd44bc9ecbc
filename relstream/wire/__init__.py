"""The wire contract: typed msgpack messages (`messages`), their codec (`codec`), their
JSON Schemas (`jsonschema`), and the conversions to and from the domain model
(`convert`)."""

from relstream.wire.codec import (
    MAX_MESSAGE_BYTES,
    MessageError,
    checked,
    decode,
    decode_json,
    decode_relquery_stepwise,
    encode,
    validate,
)
from relstream.wire.kinds import KINDS
from relstream.wire.letters import DeadLetterMessage, ReplayedMessage
from relstream.wire.messages import (
    AnswerMessage,
    ControlMessage,
    Latency,
    LoadReportMessage,
    Message,
    MetricsMessage,
    PartialResultMessage,
    RelQueryMessage,
    RelQueryRow,
    ResultMessage,
    ResultRow,
    RowMessage,
    RowUsage,
    Usage,
)

__all__ = [
    "KINDS",
    "MAX_MESSAGE_BYTES",
    "AnswerMessage",
    "ControlMessage",
    "DeadLetterMessage",
    "Latency",
    "LoadReportMessage",
    "Message",
    "MessageError",
    "MetricsMessage",
    "PartialResultMessage",
    "RelQueryMessage",
    "RelQueryRow",
    "ReplayedMessage",
    "ResultMessage",
    "ResultRow",
    "RowMessage",
    "RowUsage",
    "Usage",
    "checked",
    "decode",
    "decode_json",
    "decode_relquery_stepwise",
    "encode",
    "validate",
]
