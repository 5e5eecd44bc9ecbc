"""What the real engine's runtime keeps of a finished vLLM output (engine/runtime.py):
only an answer that ended by stop or length is cached and handed to identical rows; an
aborted one is neither. vLLM's AsyncLLM is stood in for by a scripted one, so the test
needs vLLM's Python package but never starts its engine."""

import asyncio
from types import SimpleNamespace

import pytest

from relstream.engine.identity import ModelIdentity
from relstream.engine.runtime import EngineSettings, VllmRuntime
from relstream.model import RelQuery, Row, Template

pytest.importorskip("vllm")

IDENTITY = ModelIdentity("org/model", "commit:" + "0" * 40, "float32", None, "t", "c", "0")


class ScriptedTokenizer:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return messages[-1]["content"]

    def encode(self, text, add_special_tokens):
        return list(text.encode())


class ScriptedLLM:
    """Ends each request as `endings` says, in order."""

    def __init__(self, endings: list[str]) -> None:
        self.endings = endings
        self.requests = 0

    async def generate(self, prompt, params, request_id, priority=0):
        ending = self.endings[self.requests]
        self.requests += 1
        completion = SimpleNamespace(
            text=f"text {self.requests}", token_ids=[1, 2], finish_reason=ending
        )
        yield SimpleNamespace(finished=True, outputs=[completion], metrics=None)


def serve(endings: list[str], *relqueries: RelQuery):
    llm = ScriptedLLM(endings)
    settings = EngineSettings(answer_cache_bytes=1 << 20)
    engine = VllmRuntime(settings, llm, ScriptedTokenizer(), "model", IDENTITY)

    async def scenario():
        return [await (await engine.submit(relquery)).result() for relquery in relqueries]

    results = asyncio.run(scenario())
    rows = [(row.output, row.cached) for result in results for row in result.rows]
    return llm.requests, rows, len(engine.answer_cache)


def relquery(*keys: str) -> RelQuery:
    return RelQuery("q", Template("{x}"), [Row(key, {"x": "same"}) for key in keys], 4)


def test_an_aborted_output_is_not_cached():
    for ending in ("abort", "error", "repetition"):
        requests, rows, kept = serve([ending, "stop"], relquery("a"), relquery("a"))
        assert requests == 2 and rows == [("text 1", False), ("text 2", False)] and kept == 1


def test_an_aborted_leader_leaves_its_follower_to_run_its_own_request():
    # The follower then leads the key in its place: its answer, ended by stop, is kept.
    requests, rows, kept = serve(["abort", "stop"], relquery("a", "b"))
    assert requests == 2 and rows == [("text 1", False), ("text 2", False)] and kept == 1


def test_an_output_that_ended_by_stop_or_length_is_cached_and_shared():
    for ending in ("stop", "length"):
        requests, rows, kept = serve([ending], relquery("a", "b"), relquery("a"))
        assert requests == 1 and kept == 1
        assert rows == [("text 1", False), ("text 1", False), ("text 1", True)]
