"""Engine core, stood up in the caller's process: vLLM's scheduler with no model behind it.

Built as vLLM's scheduler tests build it (a VllmConfig over a local model folder, a
KVCacheConfig, no model run) and driven with fake model outputs, so the plug-in's code
runs as it does in vLLM's engine core but in the test's or benchmark's own process. The
plug-in's contract test and the decision benchmark (`relstream_lab/paper/schedcost.py`)
both run on it; they pass the model folder (`engine.weights.model_dir`), which the engine
core's code does not build."""

from __future__ import annotations

from pathlib import Path

import torch
from vllm.config import CacheConfig, LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager

from relstream.engine.core import plugin
from relstream.engine.tags import SETTINGS_KEY

BLOCK = 16  # KV block size, in tokens
TOKEN = 7  # every fake sampled token


def build_scheduler(
    policy: str | None,
    *,
    model_folder: Path,
    async_scheduling: bool = False,
    step_log: Path | None = None,
    max_num_seqs: int = 8,
    budget: int = 64,
    num_blocks: int = 256,
    max_model_len: int = 512,
    long_prefill_token_threshold: int = 0,
    scheduling_policy: str = "fcfs",
    kv_transfer_config=None,
    max_num_active_seqs: int | None = None,
    watermark: float = 0.0,
    max_loras: int | None = None,
    fair_share: dict[str, float] | None = None,
):
    """Stock vLLM V1's scheduler (`policy` None) or relstream's plug-in deciding with
    `policy`, over the model in `model_folder` (its config only: no weights load); the
    async class where vLLM schedules ahead (the CPU platform turns async scheduling off
    in the config, so the class is chosen here as `relstream_scheduler` chooses it)."""
    model = ModelConfig(
        model=str(model_folder), dtype="float32", seed=0, max_model_len=max_model_len,
        skip_tokenizer_init=True,
    )  # fmt: skip
    scheduler = SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_model_len,
        enable_chunked_prefill=True, is_encoder_decoder=False, watermark=watermark,
        long_prefill_token_threshold=long_prefill_token_threshold, policy=scheduling_policy,
        max_num_active_seqs=max_num_active_seqs,
    )  # fmt: skip
    cache = CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=True)
    settings = {"policy": policy, "step_log": str(step_log) if step_log else None,
                "fair_share": fair_share}  # fmt: skip
    config = VllmConfig(
        scheduler_config=scheduler,
        model_config=model,
        cache_config=cache,
        additional_config={SETTINGS_KEY: settings} if policy else {},
        kv_transfer_config=kv_transfer_config,
        lora_config=LoRAConfig(max_loras=max_loras) if max_loras else None,
    )
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)]
    )
    cache.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(config)
    cls = plugin.scheduler_class(async_scheduling) if policy else Scheduler
    return cls(
        vllm_config=config,
        kv_cache_config=kv,
        block_size=BLOCK,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
    )


def fake_output(scheduler, step) -> ModelRunnerOutput:
    """A token for every request whose prompt is done after this step, none for a chunk."""
    ids = list(step.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = scheduler.requests.get(request_id)
        done = request is not None and request.num_computed_tokens >= request.num_prompt_tokens
        sampled.append([TOKEN] if done else [])
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={request_id: i for i, request_id in enumerate(ids)},
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=[],
    )
