"""What every `relstream` command shares: the console, progress bars, and the options
that many commands take (so each is spelled once)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from relstream.kafka.clients.security import MECHANISMS, PROTOCOLS, KafkaSecurity, SecurityError
from relstream.kafka.tools.brokers import BROKERS
from relstream.scheduler import DEFAULT_POLICY, POLICIES, policy_spec


def _console() -> Console:
    """Rich's console. Written to a file or a pipe, lines are not cut at 80 columns (a
    log or a grep sees whole names, `COLUMNS` still wins) and carry no colour codes."""
    if sys.stdout.isatty():
        return Console()
    columns = os.environ.get("COLUMNS", "")
    return Console(width=int(columns) if columns.isdigit() else 4096, no_color=True)


console = _console()

bootstrap_option = click.option(
    "--bootstrap", required=True, help="Kafka bootstrap address, host:port."
)
prefix_option = click.option(
    "--prefix", default="relstream.", show_default=True, help="Topic name prefix."
)
broker_kind_option = click.option(
    "--broker-kind",
    type=click.Choice(BROKERS),
    default=None,
    help="The embedded broker in use, for its client settings.",
)


def _policy(_ctx: click.Context, _param: click.Parameter, name: str) -> str:
    try:
        policy_spec(name)  # a registered policy's name, the lab's included where installed
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return name


policy_option = click.option(
    "--policy",
    default=DEFAULT_POLICY,
    show_default=True,
    callback=_policy,
    help=f"{', '.join(POLICIES)}, or one the lab registers (relserve, v0-fcfs, ...).",
)


def broker_choice(default: str, help_text: str):
    """An option naming one of the embedded brokers."""
    return click.option(
        "--broker",
        "broker_kind",
        type=click.Choice(BROKERS),
        default=default,
        show_default=True,
        help=help_text,
    )


def _env(name: str) -> str:
    return f"RELSTREAM_KAFKA_{name.upper()}"


_SECURITY_OPTIONS = (
    click.option(
        "--security-protocol",
        type=click.Choice(PROTOCOLS),
        default="PLAINTEXT",
        show_default=True,
        envvar=_env("security_protocol"),
        help="How clients talk to Kafka.",
    ),
    click.option("--sasl-mechanism", type=click.Choice(MECHANISMS), envvar=_env("sasl_mechanism")),
    click.option("--sasl-username", envvar=_env("sasl_username")),
    click.option(
        "--sasl-password",
        envvar=_env("sasl_password"),
        help=f"Better given as {_env('sasl_password')} than on the command line.",
    ),
    click.option("--ssl-cafile", type=click.Path(path_type=Path), envvar=_env("ssl_cafile")),
    click.option("--ssl-certfile", type=click.Path(path_type=Path), envvar=_env("ssl_certfile")),
    click.option("--ssl-keyfile", type=click.Path(path_type=Path), envvar=_env("ssl_keyfile")),
)


def security_options(command):
    """TLS and SASL flags (each also read from RELSTREAM_KAFKA_<NAME>), handed to the
    command as one checked `security` argument; a setting that cannot work (a missing CA
    file, SASL without credentials) stops the command at start-up, naming it."""

    @functools.wraps(command)
    def with_security(*args, **kwargs):
        try:
            kwargs["security"] = KafkaSecurity(
                protocol=kwargs.pop("security_protocol"),
                sasl_mechanism=kwargs.pop("sasl_mechanism"),
                sasl_username=kwargs.pop("sasl_username"),
                sasl_password=kwargs.pop("sasl_password"),
                ssl_cafile=kwargs.pop("ssl_cafile"),
                ssl_certfile=kwargs.pop("ssl_certfile"),
                ssl_keyfile=kwargs.pop("ssl_keyfile"),
            )
        except SecurityError as exc:
            raise click.UsageError(f"Kafka security: {exc}") from None
        return command(*args, **kwargs)

    for option in reversed(_SECURITY_OPTIONS):
        with_security = option(with_security)
    return with_security


def show_logs(logger: str) -> None:
    """Lines of `logger` at INFO and above on stderr, one per event, as a user watching a
    long-running command expects (other libraries keep their own levels)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    target = logging.getLogger(logger)
    target.addHandler(handler)
    target.setLevel(logging.INFO)
    target.propagate = False


class _NotBootstrap(logging.Filter):
    """Drops aiokafka's "Unable connect to HOST:PORT" at bootstrap: the command that
    failed says so itself in one line (its later losses of a node are kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith('Unable connect to "')


def quiet_bootstrap_errors() -> None:
    logging.getLogger("aiokafka").addFilter(_NotBootstrap())


def plain_log_config() -> dict | None:
    """A logging config (`logging.config.dictConfig`'s) for Faust's worker: one plain
    line per event on stderr when it is not a terminal (Faust's own colours its lines
    by whether stdout is one); None, Faust's own, on a terminal."""
    if sys.stderr.isatty():
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"plain": {"class": "logging.StreamHandler", "formatter": "plain"}},
        "root": {"handlers": ["plain"]},
    }


def csv_list(kind: type, value: str) -> tuple:
    """Comma-separated values of `kind`, at least one; a bad one is a usage error."""
    try:
        items = tuple(kind(item.strip()) for item in value.split(",") if item.strip())
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not items:
        raise click.BadParameter("give at least one value")
    return items


def csv_of(kind: type):
    """A click callback reading an option as `csv_list(kind, ...)`."""
    return lambda _ctx, _param, value: csv_list(kind, value)


def progress() -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console)


def unwind_on_sigterm() -> None:
    """Let SIGTERM unwind this command like Ctrl-C, through every `finally`: an engine
    shut down there takes vLLM's engine-core and worker processes with it. By default
    SIGTERM ends Python at once and leaves them running, holding gigabytes."""

    def unwind(signum: int, _frame) -> None:
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)


@contextlib.contextmanager
def stop_signals() -> Iterator[Callable[[], bool]]:
    """Within: Ctrl-C and SIGTERM ask a following reader to end (the callable turns true),
    which it does at its next poll, with its summary, instead of being interrupted inside
    the Kafka client, where an interrupt in a group join left `sink --follow` running past
    20 s. A second one interrupts at once (KeyboardInterrupt)."""
    asked = threading.Event()

    def ask(_signum: int, _frame) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()

    previous = {sig: signal.signal(sig, ask) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield asked.is_set
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# multiprocessing's resource tracker (a process of its own) warns at exit of semaphores
# vLLM's libraries leave it: five lines a stop, nothing a user can act on.
_TRACKER_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """The resource tracker's leak warnings off, for the tracker a real engine starts
    (it takes its interpreter's warning filters from the environment)."""
    filters = [f for f in os.environ.get("PYTHONWARNINGS", "").split(",") if f]
    if _TRACKER_QUIET not in filters:
        os.environ["PYTHONWARNINGS"] = ",".join([*filters, _TRACKER_QUIET])


def exit_quietly() -> None:
    """End a real engine that stopped cleanly (Ctrl-C, SIGTERM) without the interpreter's
    teardown, where nanobind extensions vLLM loads print ~30 lines of "leaked" objects:
    its logs flushed, its work committed, nothing is left to run."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
