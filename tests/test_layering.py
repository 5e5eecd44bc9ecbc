import subprocess
import sys


def test_policy_and_simulator_never_import_vllm():
    # One policy, two mechanisms: the scheduler core and the simulator stay engine-free.
    code = (
        "import sys, relstream.scheduler, relstream.engine.sim, relstream.bench.simbench;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
