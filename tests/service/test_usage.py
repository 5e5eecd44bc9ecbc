"""What a relQuery cost, counted: tokens per row and per relQuery in results and metrics,
and the Prometheus counters by query (docs/usage.md). Hand-computed fixtures; the real
engine's counts are checked against vLLM's own in tests/engine/test_vllm_engine.py."""

from relstream.model import RelQueryResult, RowResult, RowStatus
from relstream.service import metrics as engine_metrics
from relstream.service.metrics import EngineMetrics
from relstream.wire import RowUsage, Usage
from relstream.wire.convert import metrics_message, partial_result_message, result_message

ROWS = [
    RowResult(0, "ran", RowStatus.OK, "a", output_tokens=5, prompt_tokens=40,
              prefix_cached_tokens=32),
    RowResult(1, "also", RowStatus.OK, "b", output_tokens=2, prompt_tokens=41),
    RowResult(2, "cache", RowStatus.OK, "c", output_tokens=3, cached=True),
    RowResult(3, "twin", RowStatus.OK, "a", output_tokens=5, shared=True),
    RowResult(4, "bad", RowStatus.ERROR, error="row 'bad' is empty"),
]  # fmt: skip


def result(relquery_id: str = "reviews-0-12@1700000000000") -> RelQueryResult:
    return RelQueryResult(relquery_id, ROWS, None, "relstream", "smollm2")


def test_a_relquerys_usage_is_its_rows_and_cached_rows_cost_nothing():
    message = result_message(result())
    assert [row.usage for row in message.rows] == [
        RowUsage(prompt_tokens=40, prefix_cached_tokens=32, output_tokens=5),
        RowUsage(prompt_tokens=41, output_tokens=2),
        RowUsage(),
        RowUsage(),
        RowUsage(),
    ]
    total = Usage(
        prompt_tokens=81, prefix_cached_tokens=32, output_tokens=7, answer_cached_rows=1,
        shared_rows=1,
    )  # fmt: skip
    assert message.usage == total
    metrics = metrics_message(result(), "engine")
    assert metrics.usage == total and metrics.output_tokens == 7
    assert partial_result_message("q", ROWS[0]).usage == message.rows[0].usage


def test_prometheus_counts_tokens_and_rows_by_query():
    metrics = EngineMetrics()
    metrics.observe_result(result(), service_seconds=1.0)
    metrics.observe_result(result("reviews-1-0@1700000000500"), service_seconds=1.0)
    metrics.observe_result(result("sent-by-hand"), service_seconds=1.0)

    def sample(name, **labels):
        return metrics.registry.get_sample_value(name, labels)

    assert sample("relstream_query_relqueries_total", query="reviews") == 2
    assert sample("relstream_query_tokens_total", query="reviews", kind="prompt") == 162
    assert sample("relstream_query_tokens_total", query="reviews", kind="prefix_cached") == 64
    assert sample("relstream_query_tokens_total", query="reviews", kind="output") == 14
    assert sample("relstream_query_rows_total", query="reviews", source="engine") == 6
    assert sample("relstream_query_rows_total", query="reviews", source="answer_cache") == 2
    assert sample("relstream_query_rows_total", query="reviews", source="shared") == 2
    assert sample("relstream_query_relqueries_total", query="(direct)") == 1


def test_the_query_label_is_bounded(monkeypatch):
    monkeypatch.setattr(engine_metrics, "MAX_QUERY_LABELS", 2)
    metrics = EngineMetrics()
    for name in ("a", "b", "c", "a"):
        metrics.observe_result(result(f"{name}-0-0@1"), service_seconds=1.0)

    def relqueries(query):
        return metrics.registry.get_sample_value(
            "relstream_query_relqueries_total", {"query": query}
        )

    assert (relqueries("a"), relqueries("b"), relqueries("(other)")) == (2, 1, 1)
    assert relqueries("c") is None

