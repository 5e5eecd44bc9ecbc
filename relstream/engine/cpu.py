"""Service process: the settings vLLM's CPU build runs best with, set before it starts.

The engine core inherits them: they are environment variables and engine arguments the
service's process sets before vLLM spawns it.

float32 (CPUs without bf16 units run bf16 slower), eager mode (the engine starts much
sooner than with compiled graphs), a 2 GiB KV space (`VLLM_CPU_KVCACHE_SPACE`), as many
OpenMP threads as cores for the engine-core process, offline model loading, and
tcmalloc, which speeds the CPU build up but can only be preloaded when a process starts,
so the CLI re-executes itself. None of it applies on a GPU. What each was measured to
give is in docs/architecture/engine.md, "Environment facts".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
CPU_GPU_MEMORY_UTILIZATION = 0.3  # vLLM sizes its CPU KV space from VLLM_CPU_KVCACHE_SPACE


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def apply_cpu_defaults(kv_cache_gib: int) -> bool:
    """Set the CPU build's environment unless the user set it; returns True on CPU."""
    if on_gpu():
        return False
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return True


def reexec_with_tcmalloc() -> None:
    """Restart this command (`relstream`, `relstream-lab`, whatever ran it) once with
    tcmalloc preloaded (a no-op when it is missing or already loaded). Library users set
    LD_PRELOAD themselves."""
    preload = os.environ.get("LD_PRELOAD", "")
    if not TCMALLOC.exists() or "tcmalloc" in preload:
        return
    env = {**os.environ, "LD_PRELOAD": f"{TCMALLOC} {preload}".strip()}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
