"""NULL in, NULL out: an empty CSV cell and a JSON null never reach the model; each comes
back as a result row with status "null" and a reason, as SQL's AI functions return NULL."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from relstream.connectors.sources import read_rows
from relstream.kafka.clients.aio import produce, read_messages
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.model import RelQuery, Row, RowFailure, RowRequest, RowStatus, Template, prepare_row
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import check_row, relquery_for_window
from relstream.wire import ResultMessage, RowMessage, decode, encode
from relstream.wire.convert import metrics_message, result_message

REGISTRATION = QueryRegistration("nulls", "reviews", Template("Rate: {review}"))


def write_sources(tmp_path):
    """A CSV with an empty review cell and a JSONL line whose review is null."""
    csv = tmp_path / "reviews.csv"
    csv.write_text("id,review\nc1,Dry feet all week.\nc2,\n")
    jsonl = tmp_path / "reviews.jsonl"
    jsonl.write_text('{"id": "j1", "review": "Soles peel."}\n{"id": "j2", "review": null}\n')
    return csv, jsonl


def test_an_empty_csv_cell_is_null_unless_empty_strings_are_asked_for(tmp_path):
    csv, _ = write_sources(tmp_path)
    rows = list(read_rows(csv, "reviews", key_column="id"))
    assert [row.values["review"] for row in rows] == ["Dry feet all week.", None]
    kept = list(read_rows(csv, "reviews", key_column="id", empty_strings=True))
    assert kept[1].values["review"] == ""


def test_a_null_template_column_is_a_null_row_naming_the_column():
    relquery = RelQuery(
        "q",
        Template("{title}: {review}"),
        [Row("a", {"title": "t", "review": None}), Row("b", {"title": "t", "review": "ok"})],
        4,
    )
    null = prepare_row(relquery, 0)
    assert isinstance(null, RowFailure) and null.status is RowStatus.NULL
    assert null.reason == "row 'a': {review} is null; a null input gives a null answer"
    assert isinstance(prepare_row(relquery, 1), RowRequest)
    # A null in a column the template does not name changes nothing; a missing column
    # stays an error.
    other = RelQuery("q", Template("{title}"), [Row("c", {"title": "t", "review": None})], 4)
    assert isinstance(prepare_row(other, 0), RowRequest)
    missing = RelQuery("q", Template("{review}"), [Row("d", {"title": "t"})], 4)
    assert prepare_row(missing, 0).status is RowStatus.ERROR


def test_null_inputs_never_reach_the_model_and_come_back_null(broker, tmp_path):
    csv, jsonl = write_sources(tmp_path)
    rows = [*read_rows(csv, "reviews", "id"), *read_rows(jsonl, "reviews", "id")]
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:6]}.")
    backend = SimRelQueryBackend()

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout(("reviews",)))
        # The rows travel through their topic and pass the worker's checks, as they would
        # on their way into a window.
        rows_topic = topics.rows("reviews")
        await produce(broker.bootstrap, rows_topic, [(r.key.encode(), encode(r)) for r in rows])
        records = await read_messages(broker.bootstrap, rows_topic, len(rows), broker.kind)
        checked = [check_row(REGISTRATION, record.value) for record in records]
        assert all(isinstance(row, RowMessage) for row in checked), checked
        window = relquery_for_window(REGISTRATION, sorted(checked, key=lambda r: r.key), "0-0")
        config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"engine-{uuid.uuid4().hex}", broker=broker.kind
        )
        stop = asyncio.Event()
        service = asyncio.create_task(KafkaService(config, backend).run(stop))
        await produce(broker.bootstrap, topics.relqueries, [(window.id.encode(), encode(window))])
        results = await read_messages(broker.bootstrap, topics.results, 1, broker.kind)
        stop.set()
        await service
        return window, decode(ResultMessage, results[0].value)

    window, result = asyncio.run(scenario())
    assert result.id == window.id
    by_key = {row.key: row for row in result.rows}
    assert [row.key for row in result.rows] == ["c1", "c2", "j1", "j2"]
    for key in ("c2", "j2"):
        assert by_key[key].status == "null" and by_key[key].output is None
        assert (
            by_key[key].error
            == f"row {key!r}: {{review}} is null; a null input gives a null answer"
        )
    for key, text in (("c1", "Dry feet all week."), ("j1", "Soles peel.")):
        assert by_key[key].status == "ok" and by_key[key].output == f"Rate: {text}"
    # The model was asked for the two rows with a review, and never for the null ones.
    assert list(backend.recent_requests) == [f"{window.id}#0", f"{window.id}#2"]


@pytest.mark.parametrize(("value", "status"), [(None, "null"), ("", "ok")])
def test_metrics_and_the_wire_carry_the_null_status(value, status):
    # An empty string is a value, asked of the model as it is; only null is NULL.
    relquery = RelQuery("q", Template("{review}"), [Row("a", {"review": value, "id": "a"})], 4)
    result = asyncio.run(_serve(SimRelQueryBackend(), relquery))
    wire = decode(ResultMessage, encode(result_message(result)))
    assert wire.rows[0].status == status
    assert dict(metrics_message(result, "engine").rows) == {status: 1}


async def _serve(backend, relquery):
    handle = await backend.submit(relquery)
    return await handle.result()
