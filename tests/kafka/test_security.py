"""TLS and SASL settings: checked at start-up with the bad setting named, and carried
into every Kafka client relstream makes."""

import asyncio

import pytest
from click.testing import CliRunner

from relstream.cli import main
from relstream.kafka.clients.aio import Subscription, new_admin, new_consumer, new_producer
from relstream.kafka.clients.security import KafkaSecurity, SecurityError

COMMANDS = (
    ["engine", "--backend", "sim"],
    ["worker", "--config", "{config}"],
    ["produce", "{config}", "--table", "t"],
    ["results"],
    ["sink", "{out}"],
)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_missing_ca_file_stops_every_command_at_start_up(command, tmp_path):
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "t"\ntemplate = "{x}"\n')
    args = [a.format(config=config, out=tmp_path / "out.jsonl") for a in command]
    missing = tmp_path / "no-such-ca.pem"
    result = CliRunner().invoke(
        main,
        [*args, "--bootstrap", "127.0.0.1:9", "--security-protocol", "SSL"],
        env={"RELSTREAM_KAFKA_SSL_CAFILE": str(missing)},
    )
    assert result.exit_code == 2
    assert f"ssl-cafile {missing}: no such file" in result.output


def test_a_file_that_is_not_a_certificate_is_named(tmp_path):
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(SecurityError, match=f"ssl-cafile {bogus}: not a PEM CA bundle"):
        KafkaSecurity("SSL", ssl_cafile=bogus)


def test_sasl_needs_a_mechanism_and_credentials_and_hides_the_password():
    with pytest.raises(SecurityError, match="needs a SASL mechanism"):
        KafkaSecurity("SASL_PLAINTEXT", sasl_username="u", sasl_password="p")
    with pytest.raises(SecurityError, match="needs a SASL username and password"):
        KafkaSecurity("SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u")
    security = KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-512", "u", "s3cret")
    assert "s3cret" not in repr(security)


def test_the_settings_reach_every_client():
    security = KafkaSecurity("SASL_SSL", "SCRAM-SHA-256", "alice", "s3cret")

    async def clients():
        subscription = Subscription("127.0.0.1:9", "t", security=security)
        made = [
            new_consumer("127.0.0.1:9", "t", security=security),
            new_producer("127.0.0.1:9", security),
            new_admin("127.0.0.1:9", security),
            subscription._consumer,
        ]
        inner = [getattr(c, "_client", None) or c.client for c in made]
        for maker in made:  # never started: closing only releases them
            await (maker.close() if hasattr(maker, "close") else maker.stop())
        return inner

    for client in asyncio.run(clients()):
        assert client._security_protocol == "SASL_SSL"
        assert client._sasl_mechanism == "SCRAM-SHA-256"
        assert client._sasl_plain_username == "alice"
        assert client._ssl_context is not None
