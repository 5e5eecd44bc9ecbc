import subprocess
import sys

ENGINE_FREE = (
    "relstream.model",
    "relstream.backend",
    "relstream.schemas",
    "relstream.scheduler",
    "relstream.sim",
    "relstream.sim.backend",
    "relstream.bench.simbench",
)
HEAVY = ("vllm", "torch", "aiokafka", "faust")


def test_policy_simulator_and_wire_never_import_an_engine_or_a_kafka_client():
    # One policy, two mechanisms: the scheduler core, the simulator, the domain model and
    # the wire contract stay free of vLLM, torch, and the Kafka and Faust clients, so they
    # run (and are tested) anywhere, in the worker's environment too.
    code = (
        "import importlib, sys\n"
        f"for name in {ENGINE_FREE!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_kafka_client_is_made_in_one_place():
    # TLS, SASL and the embedded brokers' settings reach every client only if every
    # client comes from relstream.kafka: aiokafka's from `clients`, kafka-python's from
    # `sync` (which names its classes as strings, so only it may spell `"Kafka...`).
    import re
    from pathlib import Path

    import relstream

    package = Path(relstream.__file__).parent
    makers = {
        "kafka/clients.py": re.compile(r"\bAIOKafka(Consumer|Producer|AdminClient)\("),
        "kafka/sync.py": re.compile(r"\bKafka(Consumer|Producer|AdminClient)\b"),
    }
    offenders = sorted(
        (str(path.relative_to(package)), pattern.pattern)
        for path in package.rglob("*.py")
        for home, pattern in makers.items()
        if str(path.relative_to(package)) != home and pattern.search(path.read_text())
    )
    assert offenders == []
