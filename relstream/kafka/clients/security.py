"""TLS and SASL settings for every Kafka client relstream creates.

One `KafkaSecurity` value is built from the command line or the environment (the CLI's
`--security-protocol`, `--sasl-*` and `--ssl-*` flags, or `RELSTREAM_KAFKA_*` variables)
and handed to the engine, the worker and every command's clients. It is checked when
built, so a missing or unreadable CA file stops the process at start-up with the file
named, not at the first connection. The password never appears in its repr or in logs.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class SecurityError(ValueError):
    """A security setting that cannot work, naming the setting."""


@dataclass(frozen=True)
class KafkaSecurity:
    protocol: str = "PLAINTEXT"  # one of PROTOCOLS
    sasl_mechanism: str | None = None  # one of MECHANISMS, for the SASL protocols
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: Path | None = None  # CA bundle that signed the brokers' certificates
    ssl_certfile: Path | None = None  # client certificate, for mutual TLS
    ssl_keyfile: Path | None = None  # its private key
    _context: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise SecurityError(
                f"security protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}"
            )
        if self.protocol.startswith("SASL_"):
            if self.sasl_mechanism not in MECHANISMS:
                raise SecurityError(
                    f"{self.protocol} needs a SASL mechanism, one of {', '.join(MECHANISMS)}"
                    f" (got {self.sasl_mechanism!r})"
                )
            if not self.sasl_username or self.sasl_password is None:
                raise SecurityError(f"{self.protocol} needs a SASL username and password")
        if self.uses_tls:
            object.__setattr__(self, "_context", self._ssl_context())
        elif self.ssl_cafile or self.ssl_certfile or self.ssl_keyfile:
            raise SecurityError(f"TLS files were given but the protocol is {self.protocol}")

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def _ssl_context(self) -> ssl.SSLContext:
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise SecurityError(f"{name.replace('_', '-')} {path}: no such file")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise SecurityError("ssl-certfile and ssl-keyfile go together")
        try:
            context = ssl.create_default_context(
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None
            )
        except ssl.SSLError as exc:
            raise SecurityError(
                f"ssl-cafile {self.ssl_cafile}: not a PEM CA bundle ({exc})"
            ) from None
        if self.ssl_certfile is not None:
            try:
                context.load_cert_chain(str(self.ssl_certfile), str(self.ssl_keyfile))
            except ssl.SSLError as exc:
                raise SecurityError(
                    f"ssl-certfile {self.ssl_certfile} / ssl-keyfile {self.ssl_keyfile}: "
                    f"not a matching PEM certificate and key ({exc})"
                ) from None
        return context

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for every Kafka client: aiokafka's producer, consumer and
        admin client, and kafka-python's, which spell them alike."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self._context is not None:
            options["ssl_context"] = self._context
        if self.protocol.startswith("SASL_"):
            options.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password,
            )
        return options

    def faust_credentials(self):
        """Faust's `broker_credentials`, or None for PLAINTEXT."""
        import faust

        if self.protocol.startswith("SASL_"):
            return faust.SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password,
                ssl_context=self._context,
                mechanism=self.sasl_mechanism,
            )
        if self._context is not None:
            return faust.SSLCredentials(self._context)
        return None


PLAINTEXT = KafkaSecurity()
