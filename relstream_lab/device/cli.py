"""`relstream-lab bench gpu-steps`: time a model's steps on this machine's accelerator (or
fit steps timed elsewhere), fit the simulator's profile, and replay the long-output
trace on it against stock V1 (`bench kv-bound`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from relstream.cli.common import console
from relstream_lab.common.options import canonical_command

STEPS_SCRIPT = Path(__file__).with_name("steps.py")


@click.command("gpu-steps")
@click.option("--arch", type=click.Choice(["llama8b", "tiny"]), default="llama8b",
              show_default=True, help="The decoder's shape (tiny: for a CPU check).")  # fmt: skip
@click.option("--device", default=None, help="torch device [default: cuda if present, else cpu]")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(1))
@click.option("--steps", "steps_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Fit a steps.json timed elsewhere; time nothing.")  # fmt: skip
@click.option("--replay/--no-replay", default=True, show_default=True,
              help="Replay bench kv-bound's trace on the fitted profile.")  # fmt: skip
@click.option("--relqueries", default=60, show_default=True, type=click.IntRange(1))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def gpu_steps(arch: str, device: str | None, repeats: int, steps_file: Path | None,
              replay: bool, relqueries: int, out: Path) -> None:  # fmt: skip
    """Time prefill and decode steps of a decoder with random weights (torch alone: vLLM
    need not be there), fit the simulator's step profile, replay on it."""
    from relstream_lab.device.fit import fit_profile

    out.mkdir(parents=True, exist_ok=True)
    if steps_file is None:
        import torch

        from relstream_lab.device.steps import run

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        console.print(f"timing {arch} on {device} ...")
        document = run(arch, device, out, repeats)
    else:
        document = json.loads(steps_file.read_text())
        if steps_file.resolve() != (out / "steps.json").resolve():
            (out / "steps.json").write_text(json.dumps(document, indent=2) + "\n")
    name = f"{document['arch']}-{document['device']}".lower().replace(" ", "-")
    profile = fit_profile(document, name)
    (out / "profile.json").write_text(json.dumps(profile, indent=2) + "\n")
    fit = profile["fit"]
    console.print(
        f"fitted {name}: prefill {profile['prefill_base'] * 1e3:.2f} ms + "
        f"{profile['prefill_per_token'] * 1e6:.2f} µs/token; decode "
        f"{profile['decode_base'] * 1e3:.2f} ms + {profile['decode_per_request'] * 1e6:.2f} "
        f"µs/request + {profile['decode_per_context_token'] * 1e9:.3f} ns/context token "
        f"(worst step off by {fit['prefill_worst_relative_error']:.0%} prefill, "
        f"{fit['decode_worst_relative_error']:.0%} decode)"
    )
    if replay:
        _replay(out, relqueries)
    console.print(f"wrote {out}/steps.json, profile.json")


def _replay(out: Path, relqueries: int) -> None:
    from relstream_lab.common.workload import DEFAULT_DATASETS_DIR, TraceConfig
    from relstream_lab.kvbound.cli import POLICIES
    from relstream_lab.kvbound.run import KvBoundOptions, run_kv_bound

    profile = str(out / "profile.json")
    command = canonical_command(
        ["bench", "kv-bound"], profiles=profile, policies=POLICIES, loads="0.75,1",
        seeds="0", outputs="256-512", relqueries=relqueries, max_rows=relqueries,
        datasets="../shared/datasets", out=out / "kv-bound",
    )  # fmt: skip
    trace = TraceConfig(num_relqueries=relqueries, max_rows=relqueries, outputs=(256, 512))
    options = KvBoundOptions(
        (profile,), tuple(POLICIES.split(",")), (0.75, 1.0), (0,), trace, DEFAULT_DATASETS_DIR,
        out / "kv-bound", 1, command,
    )  # fmt: skip
    for verdict in run_kv_bound(options)["verdicts"]:
        console.print(f"{verdict['line']}: {verdict['worst_seed']:.3f} ({verdict['bound']})")
