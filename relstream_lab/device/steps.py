"""A decoder's prefill and decode steps timed with random weights, torch alone.

Where a GPU machine is lent vLLM cannot be carried there, but torch is present: this
file times what a serving step costs an architecture (a Llama-style decoder: grouped
query attention, SwiGLU) at batch sizes and contexts, so the simulator's step profile
can be fitted from a real accelerator instead of derived on paper. It imports nothing
of relstream, so the device runs it by path (`python3 relstream_lab/device/steps.py
--arch llama8b --out DIR`); `relstream-lab bench gpu-steps` runs the same code here,
then fits the profile (`fit`).

A decode step is B requests each adding one token over a KV cache of C tokens; a prefill
step is T new tokens of one prompt (causal). A few K and V tensors stand for the L
layers' caches, taken in turn: enough of them that the layers' reads together exceed the
GPU's L2 cache (a layer never finds the last one's cache there), few enough that
contexts past the device's memory for L caches can still be timed. Needs torch 2.5 or
later (grouped-query attention in `scaled_dot_product_attention`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Architecture:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @property
    def parameters(self) -> int:
        attention = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        attention += self.heads * self.head_dim * self.hidden
        return self.layers * (attention + 3 * self.hidden * self.ffn) + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes


ARCHITECTURES = {
    "llama8b": Architecture(32, 4096, 32, 8, 128, 14336, 128256),  # Llama-3-8B's shape
    "tiny": Architecture(2, 128, 4, 2, 32, 256, 512),  # for a CPU test
}
DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
DECODE_CONTEXTS = (256, 1024, 4096)
PREFILL_TOKENS = (128, 512, 1024, 2048, 4096, 8192)
KV_TOKENS_AT_MOST = 400_000  # B × C past this is not timed (an 8B model's KV on 80 GB)
CACHE_BYTES_AT_LEAST = 256 * 2**20  # the caches the layers take in turn: past any L2 (50 MB)


class Decoder:
    """Random weights for every layer; `step` runs them over hidden states."""

    def __init__(self, arch: Architecture, device: str, dtype: torch.dtype) -> None:
        self.arch, self.device, self.dtype = arch, device, dtype
        make = lambda *shape: torch.randn(*shape, device=device, dtype=dtype) * 0.02  # noqa: E731
        q, kv = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
        self.layers = [
            (make(arch.hidden, q + 2 * kv), make(q, arch.hidden), make(arch.hidden, 2 * arch.ffn),
             make(arch.ffn, arch.hidden))
            for _ in range(arch.layers)
        ]  # fmt: skip
        self.head = make(arch.hidden, arch.vocab)

    @torch.inference_mode()
    def step(self, x: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]] | None) -> None:
        """x: (batch, new tokens, hidden). With `caches` ((K, V) pairs of shape (batch,
        kv heads, context, head dim), layer i reading pair i mod their number) each new
        token attends to its layer's (decode); without, causally to x (prefill)."""
        a = self.arch
        batch, tokens, _ = x.shape
        q_width, kv_width = a.heads * a.head_dim, a.kv_heads * a.head_dim
        for index, (qkv_w, out_w, up_w, down_w) in enumerate(self.layers):
            h = F.rms_norm(x, (a.hidden,))
            q, k, v = (h @ qkv_w).split((q_width, kv_width, kv_width), dim=-1)
            q = q.view(batch, tokens, a.heads, a.head_dim).transpose(1, 2)
            if caches is None:
                k = k.view(batch, tokens, a.kv_heads, a.head_dim).transpose(1, 2)
                v = v.view(batch, tokens, a.kv_heads, a.head_dim).transpose(1, 2)
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                cache = caches[index % len(caches)]
                attended = F.scaled_dot_product_attention(q, *cache, enable_gqa=True)
            x = x + attended.transpose(1, 2).reshape(batch, tokens, q_width) @ out_w
            gate, up = (F.rms_norm(x, (a.hidden,)) @ up_w).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ down_w
        (F.rms_norm(x[:, -1], (a.hidden,)) @ self.head).argmax(-1)  # sampling's logits


def timed(model: Decoder, x: torch.Tensor, caches, repeats: int) -> float:
    """The median of `repeats` steps' seconds, after two unrecorded ones."""
    device = model.device
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    durations = []
    for index in range(repeats + 2):
        sync()
        started = time.perf_counter()
        model.step(x, caches)
        sync()
        if index >= 2:
            durations.append(time.perf_counter() - started)
    return statistics.median(durations)


def time_steps(
    arch: Architecture, device: str, dtype: torch.dtype, repeats: int = 5,
    batches=DECODE_BATCHES, contexts=DECODE_CONTEXTS, prompts=PREFILL_TOKENS,
    kv_tokens_at_most: int = KV_TOKENS_AT_MOST, on_step=lambda step: None,
) -> list[dict]:  # fmt: skip
    """Every decode (batch, context) whose KV fits `kv_tokens_at_most`, every prefill."""
    model = Decoder(arch, device, dtype)
    steps = []
    for tokens in prompts:
        x = torch.randn(1, tokens, arch.hidden, device=device, dtype=dtype)
        step = {"kind": "prefill", "tokens": tokens,
                "seconds": timed(model, x, None, repeats)}  # fmt: skip
        steps.append(step)
        on_step(step)
    for context in contexts:
        for batch in batches:
            if batch * context > kv_tokens_at_most:
                continue
            shape = (batch, arch.kv_heads, context, arch.head_dim)
            pair_bytes = 2 * batch * arch.kv_heads * context * arch.head_dim * dtype.itemsize
            count = min(arch.layers, -(-CACHE_BYTES_AT_LEAST // pair_bytes))
            caches = [
                (torch.randn(shape, device=device, dtype=dtype),
                 torch.randn(shape, device=device, dtype=dtype))
                for _ in range(count)
            ]  # fmt: skip
            x = torch.randn(batch, 1, arch.hidden, device=device, dtype=dtype)
            step = {"kind": "decode", "batch": batch, "context": context,
                    "seconds": timed(model, x, caches, repeats)}  # fmt: skip
            steps.append(step)
            on_step(step)
            del caches
    return steps


def describe_device(device: str) -> dict:
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        return {"device": props.name, "memory_bytes": props.total_memory,
                "torch": torch.__version__}  # fmt: skip
    return {"device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__}


def run(arch_name: str, device: str, out: Path, repeats: int = 5) -> dict:
    arch = ARCHITECTURES[arch_name]
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    steps = time_steps(arch, device, dtype, repeats, on_step=lambda s: print(json.dumps(s)))
    document = {
        "arch": arch_name, **asdict(arch), "parameters": arch.parameters,
        "kv_bytes_per_token": arch.kv_bytes_per_token(dtype.itemsize),
        "weight_bytes": arch.parameters * dtype.itemsize, "dtype": str(dtype),
        **describe_device(device), "repeats": repeats, "steps": steps,
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "steps.json").write_text(json.dumps(document, indent=2) + "\n")
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="llama8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    run(args.arch, args.device, args.out, args.repeats)


if __name__ == "__main__":
    main()
