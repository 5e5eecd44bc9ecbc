"""Service process: what exactly answers a request, the model's identity.

The answer cache keys answers by it (`engine/answers.py`).

Two engines share answers only when everything that decides greedy text is the same: the
full model id (a Hub id or the resolved folder, never its last path component), the
weights' revision (the Hub commit when known, else a fingerprint of the folder's
config.json and weight files), dtype, quantization, the tokenizer, the chat template and
the vLLM version. `ModelIdentity.digest` enters every `RequestKey`, and the answers topic
carries it, so an engine never loads another identity's answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger("relstream.engine")

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Files whose names and sizes say which weights a folder holds; an index's text is hashed.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")
CONFIG_FILES = ("config.json", "generation_config.json")


@dataclass(frozen=True)
class ModelIdentity:
    model: str  # the full model id: a Hub id (organisation/model) or the resolved folder
    revision: str  # "commit:<sha>" or "fingerprint:<sha256>" of config and weights
    dtype: str
    quantization: str | None
    tokenizer: str  # SHA-256 of the tokenizer's definition
    chat_template: str  # SHA-256 of the chat template
    vllm: str  # vLLM's version

    @cached_property
    def digest(self) -> str:
        """Hex SHA-256 of every field: what request keys and the answers topic carry."""
        return hashlib.sha256(msgspec.json.encode(asdict(self))).hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def folder_revision(folder: Path) -> str:
    """A Hub snapshot's commit (`.../snapshots/<commit>/`), else a fingerprint of the
    folder's config files and of its weight files' names and sizes (index files hashed
    whole), so new weights under the same path get a new revision."""
    if COMMIT.match(folder.name) and folder.parent.name == "snapshots":
        return f"commit:{folder.name}"
    digest = hashlib.sha256()
    for name in CONFIG_FILES:
        path = folder / name
        if path.is_file():
            digest.update(f"{name}\0".encode() + path.read_bytes() + b"\0")
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(folder).as_posix()
        if relative.endswith(".index.json"):
            digest.update(f"{relative}\0".encode() + path.read_bytes() + b"\0")
        elif relative.endswith(WEIGHT_SUFFIXES):
            digest.update(f"{relative}\0{path.stat().st_size}\0".encode())
    return f"fingerprint:{digest.hexdigest()}"


def hub_revision(model_id: str, revision: str | None) -> str:
    """The commit a Hub id resolved to in the local Hugging Face cache (vLLM downloaded
    it there); the named revision, or "unresolved", when the cache does not say."""
    if revision and COMMIT.match(revision):
        return f"commit:{revision}"
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(model_id, revision=revision, local_files_only=True))
    except Exception as exc:  # not in the cache, or no huggingface_hub: say so, go on
        log.warning("model identity: the commit of %s is unknown (%s)", model_id, exc)
        return f"unresolved:{revision or 'main'}"
    return folder_revision(folder)


def revision_of(model: str, revision: str | None = None) -> str:
    """`model` as `resolve_model` gives it: a local folder or a Hub id."""
    path = Path(model)
    if path.is_dir():
        return folder_revision(path.resolve())
    return hub_revision(model, revision)


def tokenizer_hash(tokenizer: Any) -> str:
    """SHA-256 of a tokenizer's full definition (a fast tokenizer's JSON), else of its
    vocabulary and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        return sha256_text(backend.to_str())
    vocab = sorted(tokenizer.get_vocab().items()) if hasattr(tokenizer, "get_vocab") else []
    specials = getattr(tokenizer, "all_special_tokens", [])
    return sha256_text(json.dumps([vocab, list(specials)], ensure_ascii=False))


def chat_template_hash(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    return sha256_text(json.dumps(template, sort_keys=True, ensure_ascii=False))


def engine_identity(llm: Any, tokenizer: Any, model_id: str, location: str) -> ModelIdentity:
    """The identity of the model a started AsyncLLM serves: `model_id` its full id,
    `location` what vLLM loaded (a folder or the Hub id)."""
    import vllm

    config = llm.vllm_config.model_config
    return ModelIdentity(
        model=model_id,
        revision=revision_of(location, getattr(config, "revision", None)),
        dtype=str(config.dtype).removeprefix("torch."),
        quantization=getattr(config, "quantization", None),
        tokenizer=tokenizer_hash(tokenizer),
        chat_template=chat_template_hash(tokenizer),
        vllm=vllm.__version__,
    )
