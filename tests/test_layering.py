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
