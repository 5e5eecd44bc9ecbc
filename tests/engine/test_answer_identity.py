"""What names a model in the answer cache's keys (relstream.engine.identity): the full
model id and its revision, so models that share a last path component, or one model at two
revisions, never share an answer. Without vLLM: the identity of a started engine is built
from the same parts (engine_identity)."""

import json
from dataclasses import replace
from pathlib import Path

from relstream.engine.answers import AnswerCache, request_key
from relstream.engine.identity import ModelIdentity, folder_revision, revision_of
from relstream.model import RelQuery, Row, Template


def model_folder(path: Path, config: dict, weights: dict[str, int]) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    for name, size in weights.items():
        (path / name).write_bytes(bytes(size))
    return path


def identity_of(folder: Path) -> ModelIdentity:
    return ModelIdentity(
        model=str(folder),
        revision=revision_of(str(folder)),
        dtype="bfloat16",
        quantization=None,
        tokenizer="1" * 64,
        chat_template="2" * 64,
        vllm="0.32.0",
    )


def digest_for(identity: ModelIdentity) -> bytes:
    relquery = RelQuery("q", Template("{x}"), [Row("r", {"x": "1"})], 4)
    return request_key(relquery, [1, 2, 3], identity.digest).digest


LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576}


def test_two_models_with_the_same_last_path_component_never_share_an_answer(tmp_path):
    # Two merges of one base: the same config, the same weight sizes, other weights.
    v1 = model_folder(tmp_path / "models/v1/merged", LLAMA, {"model.safetensors": 64})
    v2 = model_folder(tmp_path / "models/v2/merged", LLAMA, {"model.safetensors": 64})
    assert digest_for(identity_of(v1)) != digest_for(identity_of(v2))
    hub = replace(identity_of(v1), model="Qwen/Qwen2.5-7B-Instruct", revision="commit:" + "a" * 40)
    other_org = replace(hub, model="someorg/Qwen2.5-7B-Instruct")
    assert digest_for(hub) != digest_for(other_org)
    # An engine of v2 holds answers of its own identity only (the topic skips the rest).
    assert AnswerCache(1 << 20, str(v2), identity_of(v2).digest).identity != identity_of(v1).digest


def test_one_model_at_two_revisions_never_shares_an_answer(tmp_path):
    folder = model_folder(tmp_path / "m", LLAMA, {"model.safetensors": 64})
    before = identity_of(folder)
    (folder / "model.safetensors").write_bytes(bytes(128))  # new weights, same path
    after = identity_of(folder)
    assert before.revision != after.revision and digest_for(before) != digest_for(after)
    (folder / "config.json").write_text(json.dumps({**LLAMA, "rope_theta": 1e6}))
    assert identity_of(folder).revision != after.revision
    # A Hub snapshot's folder names its commit: two commits are two revisions.
    snapshots = tmp_path / "hub/models--org--m/snapshots"
    one = model_folder(snapshots / ("1" * 40), LLAMA, {"model.safetensors": 64})
    two = model_folder(snapshots / ("2" * 40), LLAMA, {"model.safetensors": 64})
    assert folder_revision(one) == "commit:" + "1" * 40
    assert digest_for(replace(before, revision=folder_revision(one))) != digest_for(
        replace(before, revision=folder_revision(two))
    )
    # The same weights at the same place are the same model: answers are shared.
    assert identity_of(folder).digest == identity_of(folder).digest


def test_dtype_quantization_tokenizer_template_and_vllm_version_enter_the_key(tmp_path):
    base = identity_of(model_folder(tmp_path / "m", LLAMA, {"model.safetensors": 64}))
    variants = [
        replace(base, dtype="float16"),
        replace(base, quantization="awq"),
        replace(base, tokenizer="3" * 64),
        replace(base, chat_template="4" * 64),
        replace(base, vllm="0.33.0"),
    ]
    digests = {digest_for(base), *(digest_for(v) for v in variants)}
    assert len(digests) == 1 + len(variants)


def test_a_tenant_salt_enters_the_key_and_travels_on_the_wire():
    from relstream.wire import RelQueryMessage, decode, encode
    from relstream.wire.convert import relquery_from_message, relquery_message

    def salted(salt: str | None) -> RelQuery:
        return RelQuery("q", Template("{x}"), [Row("r", {"x": "1"})], 4, cache_salt=salt)

    keys = [request_key(salted(salt), [1], "ab" * 32) for salt in (None, "tenant-a", "tenant-b")]
    assert len({key.digest for key in keys}) == 3
    assert request_key(salted("tenant-a"), [1], "ab" * 32) == keys[1]
    wire = decode(RelQueryMessage, encode(relquery_message(salted("tenant-a"))))
    assert wire.cache_salt == "tenant-a"
    assert relquery_from_message(wire).cache_salt == "tenant-a"
    unsalted = encode(relquery_message(salted(None)))
    assert b"cache_salt" not in unsalted  # left out at its default: older readers never see it
