"""Every third-party module relstream imports is declared in pyproject.toml, in its base
dependencies or an extra: a user who installs relstream with the extra they need (`gpu`,
`cpu`, `stream`, `connectors`) gets every import of `relstream/`."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Import name -> distribution, for what this environment does not have installed
# (faust-streaming lives in the worker's own environment).
NOT_INSTALLED_HERE = {"faust": ["faust-streaming"]}


def normalized(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    return {normalized(r) for r in [*project["dependencies"], *(r for e in extras for r in e)]}


def third_party_imports() -> dict[str, set[Path]]:
    found: dict[str, set[Path]] = {}
    for path in (REPO / "relstream").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "relstream" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(path.relative_to(REPO))
    return found


def test_every_imported_module_is_declared():
    installed = packages_distributions()
    requirements = declared()
    undeclared = {
        module: sorted(map(str, files))
        for module, files in third_party_imports().items()
        if not any(
            normalized(dist) in requirements
            for dist in installed.get(module) or NOT_INSTALLED_HERE[module]
        )
    }
    assert not undeclared, f"imported but not in pyproject.toml: {undeclared}"


def test_the_check_sees_the_imports_it_must():
    imports = third_party_imports()
    assert {"vllm", "fastapi", "faust", "aiokafka", "kafka"} <= set(imports)
    assert Path("relstream/service/http.py") in imports["fastapi"]
