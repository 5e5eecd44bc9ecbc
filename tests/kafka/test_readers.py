"""What a user types to read results: `relstream sink FILE --bootstrap ADDR` and
`relstream results`, with no broker-kind flag, on each embedded broker; and every
command against a port where no broker listens."""

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid

import pytest
from helpers import stream_bin, wait_until

from relstream.kafka.clients.aio import BROKER_CHECK_S, produce
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import DEFAULT_BROKER, EmbeddedBroker
from relstream.wire import ResultMessage, RowMessage, encode
from relstream.wire.convert import dead_letter_message
from relstream.wire.messages import ResultRow

NO_BROKER = ("--bootstrap", "127.0.0.1:1")  # a port where nothing listens


def result(index: int) -> tuple[bytes, bytes]:
    message = ResultMessage(
        id=f"q{index}",
        rows=[ResultRow(key=f"r{index}", status="ok", output=f"answer {index}")],
        latency=None,
        policy="relstream",
        model="test",
        completed_at=time.time(),
    )
    return message.id.encode(), encode(message)


def relstream(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_the_readme_sink_stores_every_result_with_no_broker_flag(broker, tmp_path):
    # The group is the sink's default; the group join takes seconds on tansu, and the
    # sink must not give up before its partitions are assigned.
    prefix = f"k{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(broker.bootstrap, topics.layout()))
    asyncio.run(produce(broker.bootstrap, topics.results, [result(i) for i in range(4)]))
    target = tmp_path / "results.jsonl"
    first = relstream("sink", str(target), "--bootstrap", broker.bootstrap, "--prefix", prefix)
    assert first.returncode == 0, first.stderr
    assert "stored 4 new results" in first.stdout
    assert len(target.read_text().splitlines()) == 4
    # Two more arrive; the group's offsets moved past exactly what the first run stored.
    asyncio.run(produce(broker.bootstrap, topics.results, [result(i) for i in (4, 5)]))
    second = relstream("sink", str(target), "--bootstrap", broker.bootstrap, "--prefix", prefix)
    assert "stored 2 new results" in second.stdout, second.stdout + second.stderr
    shown = relstream("results", "--bootstrap", broker.bootstrap, "--prefix", prefix)
    assert all(f"q{i} 1 rows" in shown.stdout for i in range(6)), shown.stdout + shown.stderr


@pytest.mark.slow
def test_the_readme_second_sink_stores_every_result_too(default_broker, tmp_path):
    # README: `sink results.jsonl`, then `sink results.csv --with-input`. One group for
    # every sink had the second store nothing; each target has its own.
    prefix = f"t{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(default_broker.bootstrap, topics.layout()))
    asyncio.run(produce(default_broker.bootstrap, topics.results, [result(i) for i in range(3)]))
    address = ("--bootstrap", default_broker.bootstrap, "--prefix", prefix)
    jsonl, table = tmp_path / "results.jsonl", tmp_path / "results.csv"
    first = relstream("sink", str(jsonl), *address)
    assert "stored 3 new results" in first.stdout, first.stdout + first.stderr
    second = relstream("sink", str(table), *address, "--with-input")
    assert "stored 3 new results" in second.stdout, second.stdout + second.stderr
    assert len(table.read_text().splitlines()) == 1 + 3  # the header, a row each
    again = relstream("sink", str(jsonl), *address)
    assert "stored 0 new results" in again.stdout, again.stdout + again.stderr


@pytest.mark.slow
def test_a_sink_that_cannot_write_stops_with_one_line_saying_what_it_stored(broker, tmp_path):
    # A full disk (a 40 KiB file-size limit): the sink neither exited nor said anything
    # for 120 s (its reader's close was left to the interpreter's exit).
    import resource

    prefix = f"d{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(broker.bootstrap, topics.layout()))
    rows = [ResultRow(key=f"r{i}", status="ok", output="x" * 500) for i in range(100)]
    big = ResultMessage(
        id="q-big", rows=rows, latency=None, policy="relstream", model="test",
        completed_at=time.time(),
    )  # fmt: skip
    messages = [result(0), (b"q-big", encode(big))]
    asyncio.run(produce(broker.bootstrap, topics.results, messages))

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (40 * 1024, 40 * 1024))

    command = [sys.executable, "-m", "relstream", "sink", str(tmp_path / "out.jsonl")]
    command += ["--bootstrap", broker.bootstrap, "--prefix", prefix]
    started = time.monotonic()
    full = subprocess.run(
        command, capture_output=True, text=True, timeout=120, preexec_fn=small_files
    )
    said = " ".join(full.stderr.split())
    assert full.returncode == 1 and time.monotonic() - started < 60, said
    assert re.search(r"could not store results in \S+ \(\[Errno 27\] File too large\): "
                     r"\d new results stored; none after them", said), said  # fmt: skip
    assert "Traceback" not in full.stderr
    denied = relstream("sink", "/proc/out.jsonl", "--bootstrap", broker.bootstrap)
    assert denied.returncode == 1 and "cannot store results in /proc/out.jsonl" in denied.stderr


@pytest.mark.slow
def test_a_reader_stopped_before_storing_leaves_its_group_where_it_was(broker):
    # A sink that dies (or whose store fails) after taking results from a batch but
    # before storing them must not have moved its group past them.
    from relstream.client import RelstreamClient

    prefix = f"s{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(broker.bootstrap, topics.layout()))
    asyncio.run(produce(broker.bootstrap, topics.results, [result(i) for i in range(4)]))
    with RelstreamClient(broker.bootstrap, prefix) as client:
        reader = client.results(group="a-sink")
        assert next(reader).id.startswith("q")
        reader.close()  # the sink stops here, before it stored what it took
        stored_later = [r.id for r in client.results(group="a-sink")]
    assert sorted(stored_later) == [f"q{i}" for i in range(4)]


def test_producing_to_a_table_with_no_rows_topic_refuses_naming_those_that_exist(broker, tmp_path):
    # A typo in --table created relstream.rows.reveiws, which nobody reads, and exited 0
    # (issue 49). Now it is refused, naming the tables there are, unless --create.
    prefix = f"t{uuid.uuid4().hex[:6]}."
    asyncio.run(create_topics(broker.bootstrap, Topics(prefix=prefix).layout(("reviews",))))
    table = tmp_path / "rows.csv"
    table.write_text("id,review\nr1,fine\n")
    args = ("produce", str(table), "--bootstrap", broker.bootstrap, "--prefix", prefix)
    typo = relstream(*args, "--table", "reveiws", "--key-column", "id")
    assert typo.returncode == 1 and "Traceback" not in typo.stderr
    said = " ".join(typo.stderr.split())
    assert f"{prefix}rows.reveiws does not exist; tables with rows topics: reviews" in said
    assert "Nothing was sent (--create makes it" in said
    assert f"{prefix}rows.reveiws" not in asyncio.run(create_topics(broker.bootstrap, {}))
    made = relstream(*args, "--table", "reveiws", "--key-column", "id", "--create")
    assert made.returncode == 0 and "produced 1 rows" in made.stdout, made.stderr
    known = relstream(*args, "--table", "reviews", "--key-column", "id")
    assert "warning" not in known.stdout and "produced 1 rows" in known.stdout


def test_producing_to_a_table_no_query_reads_warns_and_strict_sends_nothing(
    default_broker, tmp_path
):
    # The topic existing is no sign that a query reads it: --config says which tables do.
    prefix = f"c{uuid.uuid4().hex[:6]}."
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "{review}"\n')
    table = tmp_path / "rows.csv"
    table.write_text("id,review\nr1,fine\n")
    args = ("produce", str(table), "--bootstrap", default_broker.bootstrap, "--prefix", prefix)
    args += ("--key-column", "id", "--config", str(config))
    strict = relstream(*args, "--table", "reveiws", "--strict")
    assert strict.returncode == 1 and "nothing was sent" in strict.stderr
    typo = relstream(*args, "--table", "reveiws")
    assert typo.returncode == 1 and "--create sends them anyway" in typo.stderr
    typo = relstream(*args, "--table", "reveiws", "--create")
    said = " ".join(typo.stdout.split())
    assert f"warning: no query in {config} reads table 'reveiws'; its queries read reviews" in said
    assert "produced 1 rows" in said and "does not exist" not in said
    known = relstream(*args, "--table", "reviews")
    assert "warning" not in known.stdout and "produced 1 rows" in known.stdout
    # Without --config, --strict refuses a table whose rows topic does not exist yet.
    bare = relstream(*args[:-2], "--table", "reveiws2", "--strict")
    assert bare.returncode == 1 and "does not exist" in bare.stderr, bare.stderr
    assert f"{prefix}rows.reveiws2" not in asyncio.run(create_topics(default_broker.bootstrap, {}))


@pytest.mark.slow
def test_a_row_too_long_for_the_model_is_named_when_produced(default_broker, tmp_path):
    # `produce --estimate` said "not asked 1"; plain `produce` said nothing, and the row
    # came back as an error row.
    prefix = f"l{uuid.uuid4().hex[:6]}."
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "{review}"\n'
        "max_output_tokens = 8\n"
    )
    table = tmp_path / "rows.csv"
    table.write_text(f"id,review\nr1,fine\nr2,{'word ' * 600}\n")  # r2: ~600 tokens
    args = ("produce", str(table), "--bootstrap", default_broker.bootstrap, "--prefix", prefix)
    args += ("--key-column", "id", "--config", str(config), "--table", "reviews")
    args += ("--max-model-len", "512")
    strict = relstream(*args, "--strict")
    said = " ".join(strict.stderr.split())
    assert strict.returncode == 1 and "(--strict: nothing was sent)" in said, said
    sent = relstream(*args)
    said = " ".join(sent.stdout.split())
    assert sent.returncode == 0 and "produced 2 rows" in said, said + sent.stderr
    assert re.search(
        r"warning: query 'q': 1 of 2 rows of \S+ have a prompt over the context "
        r"\(--max-model-len 512 less 8 output tokens\): 'r2' \(\d{3} tokens\); the engine "
        r"answers them with an error row", said
    ), said  # fmt: skip
    fits = relstream(*args[:-2])  # 2048 tokens: both fit
    assert "warning" not in fits.stdout and "produced 2 rows" in fits.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ("sink", "{tmp}/out.jsonl"),
        ("results",),
        ("produce", "relstream/data/sample_reviews.csv", "--table", "reviews"),
        ("engine", "--backend", "sim"),
    ],
)
def test_no_broker_is_one_line_within_ten_seconds(command, tmp_path):
    command = [part.format(tmp=tmp_path) for part in command]
    started = time.monotonic()
    run = relstream(*command, *NO_BROKER, timeout=60)
    elapsed = time.monotonic() - started
    # The interpreter's start aside; the engine tries a refused connection again for
    # `BROKER_CHECK_S` (a broker restarting), then says so.
    bound = BROKER_CHECK_S + 5 if command[0] == "engine" else 10 + 3
    assert run.returncode == 1 and elapsed < bound
    assert_one_line_naming_the_address(run.stderr)


def assert_one_line_naming_the_address(stderr: str) -> None:
    # The command's own line alone: no aiokafka "ERROR Unable connect" line ahead of it.
    assert "Traceback" not in stderr and "no Kafka broker answered" in stderr
    assert "127.0.0.1" in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("Error: "), stderr


@pytest.mark.slow
def test_the_worker_with_no_broker_is_one_line_once_its_wait_is_over(tmp_path):
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "t"\ntemplate = "{x}"\n')
    started = time.monotonic()
    run = subprocess.run(
        [str(stream_bin() / "relstream"), "worker", "--config", str(config), *NO_BROKER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # It waits `BROKER_CHECK_S` for a broker restarting, as the engine does.
    assert run.returncode == 1 and time.monotonic() - started < BROKER_CHECK_S + 5
    assert_one_line_naming_the_address(run.stderr)


@pytest.mark.slow
def test_the_client_with_no_broker_raises_one_error_naming_the_address():
    from relstream.client import BrokerUnavailable, RelstreamClient

    started = time.monotonic()
    with pytest.raises(BrokerUnavailable) as raised:
        RelstreamClient("127.0.0.1:1")
    assert time.monotonic() - started < 10
    assert "no Kafka broker answered at 127.0.0.1:1" in str(raised.value)
    # Raised from None: the user's traceback is theirs and ours, not kafka-python's.
    assert raised.value.__suppress_context__ and raised.value.__cause__ is None


def test_a_wrongly_typed_registration_is_one_line_naming_the_field(tmp_path):
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "t"\ntemplate = "{x}"\nmax_rows = "100"\n')
    run = relstream("worker", "--config", str(config), *NO_BROKER)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == [
        f"Error: {config} [[query]] #1: field max_rows: expected `int`, got `str`"
    ]


def test_the_dead_letter_command_shows_each_reason_and_counts_them(broker):
    prefix = f"d{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(broker.bootstrap, topics.layout()))
    letters = [
        dead_letter_message(b"\xc1", topics.relqueries, 0, 3, "not valid msgpack (bad)", b"a", 100),
        dead_letter_message(
            b"x" * 5000, topics.relqueries, 1, 8, "row 'z1' lacks column(s) {reveiw}", b"b", 100
        ),
    ]
    asyncio.run(
        produce(broker.bootstrap, topics.deadletter, [(ltr.key, encode(ltr)) for ltr in letters])
    )
    shown = relstream("deadletters", "--bootstrap", broker.bootstrap, "--prefix", prefix)
    assert shown.returncode == 0, shown.stderr
    assert f"{topics.relqueries}[0]@3 1 bytes: not valid msgpack (bad)" in shown.stdout
    assert f"{topics.relqueries}[1]@8 5000 bytes (cut): row 'z1' lacks column(s)" in shown.stdout
    said = " ".join(shown.stdout.split())
    assert "2 dead letters" in said
    assert "1 × not valid msgpack (bad) (e.g. a)" in said
    assert "1 × row … lacks column(s) {reveiw} (e.g. b)" in said


@pytest.mark.slow
def test_status_shows_topics_groups_engines_and_dead_letters(broker, tmp_path):
    from relstream.wire import MetricsMessage

    prefix = f"st{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(broker.bootstrap, topics.layout(("reviews",))))
    asyncio.run(produce(broker.bootstrap, topics.results, [result(i) for i in range(3)]))
    answered = MetricsMessage(
        relquery_id="q0", latency=None, rows={"ok": 1}, output_tokens=2, policy="relstream",
        model="m", engine="host:42", at=time.time(),
    )  # fmt: skip
    asyncio.run(produce(broker.bootstrap, topics.metrics, [(b"q0", encode(answered))]))
    reason = "not valid msgpack (x)"
    letter = dead_letter_message(b"\xc1", topics.relqueries, 0, 3, reason, b"a", 100)
    asyncio.run(produce(broker.bootstrap, topics.deadletter, [(b"a", encode(letter))]))
    # A sink that stored one batch: its group has offsets on the results topic.
    stored = str(tmp_path / "results.jsonl")
    sink = relstream("sink", stored, "--bootstrap", broker.bootstrap, "--prefix", prefix)
    assert sink.returncode == 0, sink.stderr
    shown = relstream("status", "--bootstrap", broker.bootstrap, "--prefix", prefix)
    assert shown.returncode == 0, shown.stderr
    said = " ".join(shown.stdout.split())
    assert f"{prefix}results" in said and "relstream-sink" in said and "results reader" in said
    assert "engine host:42: 1 relQueries answered" in said
    assert "1 dead letters 1 × not valid msgpack" in said
    assert "1 × not valid msgpack (x) (e.g. a)" in said


def test_results_count_rows_by_status_show_the_unanswered_first_and_filter(broker):
    prefix = f"f{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    rows = [ResultRow(key=f"r{i}", status="ok", output=f"answer {i}") for i in range(4)]
    rows.append(ResultRow(key="r4", status="error", error="row 'r4': no column 'review'"))
    window = ResultMessage(
        id="sentiment-0-0@1764000000000", rows=rows, latency=None, policy="relstream",
        model="test", completed_at=time.time(),
    )  # fmt: skip
    asyncio.run(create_topics(broker.bootstrap, topics.layout()))
    messages = [(window.id.encode(), encode(window)), result(7)]
    asyncio.run(produce(broker.bootstrap, topics.results, messages))
    reader = ("results", "--bootstrap", broker.bootstrap, "--prefix", prefix)
    shown = relstream(*reader, "--query", "sentiment").stdout
    assert "5 rows: error 1, ok 4" in shown and "q7" not in shown, shown
    lines = [line.strip() for line in shown.splitlines() if line.startswith("  ")]
    assert lines[0] == "r4: error: row 'r4': no column 'review'"  # never hidden
    assert lines[-1] == "... and 2 more rows (--all shows them)"
    every = relstream(*reader, "--id", "q7", "--id", window.id, "--all").stdout
    assert "q7 1 rows: ok 1" in every and "r3: answer 3" in every and "more rows" not in every


@pytest.mark.slow
def test_results_of_an_unknown_query_say_which_exist_and_a_query_is_never_a_prefix(broker):
    # `results --query sentimnet` (a typo) printed nothing and exited 0; `--query review`
    # also showed the windows of `review-sentiment` (ids were matched by prefix).
    prefix = f"u{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)

    def window(query: str) -> tuple[bytes, bytes]:
        message = ResultMessage(
            id=f"{query}-0-0@1764000000000",
            rows=[ResultRow(key="r0", status="ok", output=f"{query} answer")],
            latency=None, policy="relstream", model="test", completed_at=time.time(),
        )  # fmt: skip
        return message.id.encode(), encode(message)

    asyncio.run(create_topics(broker.bootstrap, topics.layout()))
    messages = [window("review-sentiment"), window("review")]
    asyncio.run(produce(broker.bootstrap, topics.results, messages))
    reader = ("results", "--bootstrap", broker.bootstrap, "--prefix", prefix)
    typo = relstream(*reader, "--query", "review-sentimnet")
    assert typo.returncode == 1, typo.stdout + typo.stderr
    said = " ".join(typo.stderr.split())
    assert (
        f"no result of query 'review-sentimnet' on {topics.results} (did you mean --query "
        "review-sentiment?); queries with results there: review, review-sentiment" in said
    ), said
    only = relstream(*reader, "--query", "review")
    assert only.returncode == 0 and "review answer" in only.stdout, only.stdout + only.stderr
    assert "review-sentiment" not in only.stdout, only.stdout
    unknown_id = relstream(*reader, "--id", "q404")
    assert unknown_id.returncode == 1 and "no result with id 'q404'" in unknown_id.stderr


def test_the_workers_logs_are_plain_text_when_not_on_a_terminal(default_broker, tmp_path):
    # Redirected to a file (as under systemd or `> worker.log`), no terminal codes.
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "t"\ntemplate = "{x}"\n')
    ready = tmp_path / "ready"
    worker = subprocess.Popen(
        [str(stream_bin() / "relstream"), "worker", "--config", str(config), "--bootstrap",
         default_broker.bootstrap, "--prefix", f"p{uuid.uuid4().hex[:6]}.", "--ready-file",
         str(ready), "--app-id", f"a{uuid.uuid4().hex[:6]}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), "the worker did not get ready"
    finally:
        worker.terminate()
        logs, _ = worker.communicate(timeout=60)
    assert "INFO query q: windows of" in logs
    assert "\x1b" not in logs and "\b" not in logs, repr(logs)


@pytest.mark.slow
def test_a_template_column_no_row_has_is_said_at_the_workers_start(default_broker, tmp_path):
    # `{reveiw}`: the worker started without a word and dead-lettered every row.
    prefix = f"m{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(default_broker.bootstrap, topics.layout(("reviews",))))
    row = RowMessage(table="reviews", key="k1", values={"review": "fine", "stars": 4})
    asyncio.run(produce(default_broker.bootstrap, topics.rows("reviews"), [(b"k1", encode(row))]))
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "{reveiw}"\n')
    ready = tmp_path / "ready"
    worker = subprocess.Popen(
        [str(stream_bin() / "relstream"), "worker", "--config", str(config), "--bootstrap",
         default_broker.bootstrap, "--prefix", prefix, "--ready-file", str(ready),
         "--app-id", f"a{uuid.uuid4().hex[:6]}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: ready.exists() or worker.poll() is not None, 90, "the worker ready")
    finally:
        worker.terminate()
        logs, _ = worker.communicate(timeout=60)
    said = " ".join(logs.split())
    assert (
        f"query 'q' uses {{reveiw}}, which the newest row of {topics.rows('reviews')} ('k1') "
        "lacks (it has review, stars; did you mean {review} for {reveiw}?): every row "
        "without it is dead-lettered" in said
    ), said


@pytest.mark.slow
def test_an_interrupted_produce_says_what_the_broker_has_and_skip_sends_the_rest(
    default_broker, tmp_path
):
    # Ctrl-C printed "Aborted!" and no count; run again, it sent every row twice and the
    # sinks stored them twice under new window ids (issue 49). Now it says how many rows
    # from the first the broker has, and --skip sends the rest: every key once.
    import signal

    from kafka import KafkaConsumer, TopicPartition

    prefix = f"i{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    asyncio.run(create_topics(default_broker.bootstrap, topics.layout(("reviews",))))
    table = tmp_path / "rows.csv"
    rows = 200_000
    table.write_text("id,review\n" + "".join(f"r{i},review {i}\n" for i in range(rows)))
    args = [sys.executable, "-m", "relstream", "produce", str(table), "--table", "reviews",
            "--key-column", "id", "--bootstrap", default_broker.bootstrap,
            "--prefix", prefix]  # fmt: skip
    parts = [TopicPartition(topics.rows("reviews"), p) for p in range(topics.partitions)]
    reader = KafkaConsumer(bootstrap_servers=default_broker.bootstrap)

    def on_topic() -> int:
        return sum(reader.end_offsets(parts).values())

    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while on_topic() < 1000:
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "nothing produced"
        time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    said = " ".join(err.split())
    found = re.search(rf"interrupted: the broker has the first (\d+) of {rows} rows", said)
    assert first.returncode == 1 and found, out + err
    have = int(found.group(1))
    assert f"run again with --skip {have} to send the rest" in said
    assert 0 < have < rows and on_topic() >= have
    rest = subprocess.run([*args, "--skip", str(have)], capture_output=True, text=True, timeout=300)
    assert rest.returncode == 0, rest.stderr
    assert f"produced {rows - have} rows" in rest.stdout and f"first {have} skipped" in rest.stdout
    reader.assign(parts)
    reader.seek_to_beginning()
    keys: list[bytes] = []
    while len(keys) < on_topic():
        keys += [m.key for batch in reader.poll(timeout_ms=1000).values() for m in batch]
    reader.close()
    assert len(keys) == len(set(keys)) == rows  # each row on the topic once


@pytest.mark.slow
def test_results_follow_says_when_its_broker_is_out_and_back_and_reads_on(tmp_path):
    # A following reader waits through a broker outage by itself; it says so once when
    # the broker stops answering and once when it answers again, then prints what came.
    broker = EmbeddedBroker(DEFAULT_BROKER, data_dir=tmp_path / "broker")
    broker.start()
    prefix = f"o{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix=prefix)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    try:
        asyncio.run(create_topics(broker.bootstrap, topics.layout()))
        asyncio.run(produce(broker.bootstrap, topics.results, [result(1)]))
        command = [sys.executable, "-m", "relstream", "results", "--follow",
                   "--bootstrap", broker.bootstrap, "--prefix", prefix]  # fmt: skip
        with out.open("w") as stdout, err.open("w") as stderr:
            unbuffered = {**os.environ, "PYTHONUNBUFFERED": "1"}  # each line as printed
            reader = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=unbuffered)
        try:
            wait_until(lambda: "answer 1" in out.read_text(), 60,
                       f"the first result printed {out.read_text()!r} {err.read_text()!r}")
            broker.stop()
            wait_until(lambda: "does not answer" in err.read_text(), 60, "the outage said")
            broker.start()
            asyncio.run(produce(broker.bootstrap, topics.results, [result(2)]))
            wait_until(lambda: "answer 2" in out.read_text(), 60, "the next result printed")
            wait_until(lambda: "answers again" in err.read_text(), 30, "the return said")
        finally:
            reader.terminate()
            reader.wait(30)
    finally:
        broker.stop()
    said = err.read_text()
    assert said.count("does not answer") == 1 and "Traceback" not in said, said


@pytest.mark.slow
def test_a_group_reader_joins_once_knowing_its_topics_partitions(broker, caplog):
    # kafka-python joined first without the topic's metadata (no partitions to assign),
    # then again once it came; a poll that ran out while that second join was in flight
    # left the member joined to nothing for good (kafka-python 3.0.12: the join is only
    # driven while a rejoin is "needed", and its own assignment made it not needed): a
    # sink on a loaded machine failed "given no partition within 60 s" (CI). A reader
    # now learns the topic's partitions before it joins, and joins once.
    import logging

    from relstream.client import RelstreamClient

    topics = Topics(prefix=f"j{uuid.uuid4().hex[:6]}.")
    asyncio.run(create_topics(broker.bootstrap, topics.layout()))
    asyncio.run(produce(broker.bootstrap, topics.results, [result(i) for i in range(4)]))
    caplog.set_level(logging.INFO, logger="kafka.coordinator")
    with RelstreamClient(broker.bootstrap, topics.prefix, broker_kind=broker.kind) as client:
        read = list(client.results(f"g-{uuid.uuid4().hex[:6]}", join_timeout=20))
    assert sorted(r.id for r in read) == [f"q{i}" for i in range(4)]
    joins = [r for r in caplog.records if r.getMessage().startswith("Successfully joined")]
    # Tansu may start a rebalance of its own (it lets a member join after half its
    # session), so only Kafka's count says the reader joined once of itself.
    assert len(joins) == 1 or broker.kind != "kafka", [r.getMessage() for r in caplog.records]
