"""A stop is quiet: `relstream engine --backend sim`, busy with relQueries, ends within
10 s of Ctrl-C's SIGINT or of SIGTERM sent to its whole process group (a terminal's
Ctrl-C, `timeout`, systemd), with no traceback and no ERROR line: its simulating children
leave the stop to it, so nothing reads as a failure where nothing was lost."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from helpers import relquery, wait_until

from relstream.kafka.clients.creation import create_topics
from relstream.wire import encode
from relstream.wire.convert import relquery_message

STOPS_S = 10  # from the signal to the process's end
BUSY_ROWS = 4000  # rows of each relQuery: the children simulate for a while
ANSWERED = "answered rq-"  # the engine's log line for each relQuery answered


async def send(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=1 << 20)
    await producer.start()
    try:
        for index in range(count):
            rq = relquery(index, BUSY_ROWS)
            await producer.send_and_wait(topic, encode(relquery_message(rq)), rq.id.encode())
    finally:
        await producer.stop()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_busy_sim_engine_stopped_by_its_process_group_says_no_error(
    default_broker, tmp_path, sig
):
    from relstream.kafka.clients.topics import Topics

    topics = Topics(prefix=f"q{uuid.uuid4().hex[:6]}.")
    asyncio.run(create_topics(default_broker.bootstrap, topics.layout()))
    asyncio.run(send(default_broker.bootstrap, topics.relqueries, 12))
    log, ready = tmp_path / "engine.log", tmp_path / "ready"
    command = [
        sys.executable, "-m", "relstream", "engine", "--backend", "sim",
        "--bootstrap", default_broker.bootstrap, "--prefix", topics.prefix,
        "--group", f"g-{uuid.uuid4().hex[:6]}", "--ready-file", str(ready),
    ]  # fmt: skip
    with log.open("w") as out:  # its own process group, as a shell gives a pipeline
        engine = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip

    def serving() -> bool:
        """One relQuery answered: its children simulate the others (4000 rows each)."""
        assert engine.poll() is None, log.read_text()[-3000:]
        return ANSWERED in log.read_text()

    try:
        wait_until(serving, 120, "serving")
        signalled = time.monotonic()
        os.killpg(engine.pid, sig)
        engine.wait(STOPS_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOPS_S} s after {sig.name}:\n{log.read_text()[-3000:]}")
    finally:
        if engine.poll() is None:
            os.killpg(engine.pid, signal.SIGKILL)
            engine.wait()
    said = log.read_text(errors="replace")
    assert time.monotonic() - signalled < STOPS_S
    assert engine.returncode == 0, said[-3000:]
    assert "Traceback" not in said and "ERROR" not in said and "Error:" not in said, said[-3000:]
