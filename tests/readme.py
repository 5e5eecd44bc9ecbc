"""The README's tested code blocks (each marked `<!-- readme-test: NAME -->`), split into
the commands a user pastes one at a time, and run the way a user runs them: services in
the background until they say they are ready, every other command to its end."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from relstream.launch import wait_ready

README = Path(__file__).resolve().parents[1] / "README.md"
MARKED = re.compile(r"<!-- readme-test: (\S+) -->\n```(\w*)\n(.*?)\n```", re.S)
HEREDOC = re.compile(r"<<'?(\w+)'?")
BACKGROUND = re.compile(r"^(?P<command>.*?)\s*&\s*(#.*)?$")
# A command that runs until stopped, by what it contains.
SERVICES = ("relstream broker", "relstream worker", "relstream engine", "relstream serve")
FOLLOWS = "--follow"  # a reader that waits for more until stopped


def blocks() -> dict[str, tuple[str, str]]:
    """Each marked block of the README: name -> (language, text)."""
    return {name: (language, text) for name, language, text in MARKED.findall(README.read_text())}


def commands(shell: str) -> list[str]:
    """The block's commands as a shell reads them: comment lines dropped, a heredoc kept
    with the command that opens it."""
    found: list[str] = []
    lines = iter(shell.splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        command = line
        if heredoc := HEREDOC.search(line):
            for body in lines:
                command += "\n" + body
                if body == heredoc.group(1):
                    break
        found.append(command)
    return found


def is_service(command: str) -> bool:
    if FOLLOWS in command or any(name in command for name in SERVICES):
        return True
    return BACKGROUND.match(command) is not None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Session:
    """A folder a user works in, with the project's environments linked in; the README's
    ports swapped for free ones, so a test never meets another process's broker."""

    workdir: Path
    ports: dict[str, int]  # the README's port -> the one used here
    services: list[tuple[subprocess.Popen, Path]] = field(default_factory=list)
    # What a terminal keeps between commands: a block's `export`, `mkdir` and `cd` lines,
    # run again before each later command (each runs in a shell of its own, from workdir).
    prelude: list[str] = field(default_factory=list)

    def keeps(self, command: str) -> bool:
        """Whether `command` sets the terminal up (kept in the prelude, not run alone)."""
        if command.split()[0] in ("export", "mkdir", "cd"):
            self.prelude.append(command)
            return True
        return False

    def shell(self, command: str) -> list[str]:
        """The argv that runs `command` as a terminal set up by the prelude would."""
        return ["bash", "-c", "\n".join([*self.prelude, command])]

    def here(self, text: str) -> str:
        for default, port in self.ports.items():
            text = re.sub(rf"\b{default}\b", str(port), text)
        return text

    def start(
        self,
        command: str,
        ready: str | None = None,
        timeout: float = 120,
        ready_file: Path | None = None,
    ) -> Path:
        """Run a service in the background; wait for `ready_file` to be written (the
        command writes it: `--ready-file`) or for `ready` in its output, if given."""
        background = BACKGROUND.match(command)
        command = background.group("command") if background else command
        log = self.workdir / f"service-{len(self.services)}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                self.shell(command),
                cwd=self.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.services.append((process, log))
        if ready_file is not None:
            try:
                wait_ready([ready_file], [process], timeout)
            except RuntimeError as exc:
                raise AssertionError(f"{exc}:\n{log.read_text()}") from None
        if ready is not None:
            self.wait_for(log, ready, timeout, process)
        return log

    @staticmethod
    def wait_for(log: Path, text: str, timeout: float, process=None) -> None:
        deadline = time.monotonic() + timeout
        while text not in log.read_text():
            if process is not None and process.poll() is not None:
                raise AssertionError(f"exited {process.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout:g} s:\n{log.read_text()}")
            time.sleep(0.2)

    def run(self, argv: list[str], timeout: float = 180) -> str:
        """Run to the end; the output, once it exited 0 and printed no traceback."""
        done = subprocess.run(
            argv, cwd=self.workdir, capture_output=True, text=True, timeout=timeout
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{argv[-1]}\nexited {done.returncode}:\n{output}"
        assert "Traceback" not in output, f"{argv[-1]}\n{output}"
        return output

    def stop(self) -> list[str]:
        """Stop every service, the last started first (as a user stops the broker after
        its clients); the logs of those that printed a traceback."""
        for process, _ in reversed(self.services):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        return [log.read_text() for _, log in self.services if "Traceback" in log.read_text()]
