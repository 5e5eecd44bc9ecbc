import subprocess
import sys

ENGINE_FREE = (
    "relstream.model",
    "relstream.backend",
    "relstream.wire",
    "relstream.scheduler",
    "relstream.placement.load",
    "relstream.placement.choice",
    "relstream.sim",
    "relstream.sim.backend",
    "relstream_lab.paper.run",
)
HEAVY = ("vllm", "torch", "aiokafka", "faust")


def parsed(source: str):
    """`ast.parse(source)`, tried again on CPython 3.11's spurious "AST constructor
    recursion depth mismatch" (gh-106905: another thread of the worker, a traceback
    formatted by an earlier test's background task, parsing at the same moment)."""
    import ast

    try:
        return ast.parse(source)
    except SystemError:
        return ast.parse(source)


def imported(source: str) -> list[str]:
    """The modules `source` imports by absolute name (`from X import y` names X)."""
    import ast

    names = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def page(name: str) -> str:
    """The text of `docs/architecture/<name>`, the page that holds a table read here."""
    from pathlib import Path

    return (Path(__file__).resolve().parents[2] / "docs" / "architecture" / name).read_text()


def test_policy_simulator_and_wire_never_import_an_engine_or_a_kafka_client():
    # One policy, two mechanisms: the scheduler core, the simulator, the domain model,
    # placement's load and choice and the wire contract stay free of vLLM, torch, and the
    # Kafka and Faust clients, so they run (and are tested) anywhere, in the worker's
    # environment and vLLM's engine core too.
    code = (
        "import importlib, sys\n"
        f"for name in {ENGINE_FREE!r}: importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_kafka_client_is_made_in_one_place():
    # TLS, SASL and the embedded brokers' settings reach every client only if every
    # client comes from relstream.kafka: aiokafka's from `clients`, kafka-python's from
    # `sync` (which names its classes as strings, so only it may spell `"Kafka...`).
    import re
    from pathlib import Path

    import relstream

    package = Path(relstream.__file__).parent
    makers = {
        "kafka/clients/aio.py": re.compile(r"\bAIOKafka(Client|Consumer|Producer|AdminClient)\("),
        "kafka/clients/sync.py": re.compile(r"\bKafka(Consumer|Producer|AdminClient)\b"),
    }
    offenders = sorted(
        (str(path.relative_to(package)), pattern.pattern)
        for path in package.rglob("*.py")
        for home, pattern in makers.items()
        if str(path.relative_to(package)) != home and pattern.search(path.read_text())
    )
    assert offenders == []


def imported_units() -> dict[str, set[str]]:
    """Each top-level module or package of relstream -> the others it imports (a package's
    module named where the table names one, as `engine.tokenizer`)."""
    from pathlib import Path

    import relstream

    root = Path(relstream.__file__).parent
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        unit = parts[0].removesuffix(".py")
        for name in imported(path.read_text()):
            target = name.split(".")[1:3]
            if name.startswith("relstream.") and target[0] != unit:
                found.setdefault(unit, set()).add(".".join(target))
    return found


def test_every_package_imports_only_what_the_architecture_table_says():
    import re

    text = page("README.md")
    table = text[text.index("| package | owns | may import |") :].split("\n\n")[0]
    allowed: dict[str, set[str]] = {}
    for row in table.splitlines()[2:]:
        package, _, may = [cell.strip() for cell in row.strip("|").split("|")]
        unit = package.strip("`").removesuffix(".py").removesuffix("/")
        names = set(re.findall(r"`([^`]+)`", may))
        allowed[unit] = set(allowed) if may == "everything above" else names
    units = imported_units()
    assert set(units) - {"__main__"} <= set(allowed)  # every importing unit has its row
    for unit, targets in units.items():
        if unit == "__main__":
            continue
        wrong = {t for t in targets if not {t, t.split(".")[0]} & allowed[unit]}
        assert not wrong, f"{unit} imports {sorted(wrong)}, which its row does not allow"


def test_the_product_never_imports_the_lab():
    # The lab (relstream_lab: benchmarks, drills, reference policies) imports the product,
    # never the other way: `relstream` runs, and is tested, without it. Its policies reach
    # the registry through the `relstream.policies` entry point, which names no module here.
    from pathlib import Path

    import relstream

    root = Path(relstream.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        names = imported(text)
        if any(name.split(".")[0] == "relstream_lab" for name in names):
            offenders.append(str(path.relative_to(root)))
        if 'import_module("relstream_lab' in text or "import_module('relstream_lab" in text:
            offenders.append(str(path.relative_to(root)))
    assert offenders == []


def test_each_kafka_module_sits_in_a_room_and_imports_only_the_rooms_its_row_allows():
    import re
    from pathlib import Path

    import relstream

    text = page("delivery.md")
    table = text[text.index("| kafka room | holds | may import |") :].split("\n\n")[0]
    allowed = {}
    for row in table.splitlines()[2:]:
        room, _, may = [cell.strip() for cell in row.strip("|").split("|")]
        allowed[room.strip("`/")] = set(re.findall(r"`([^`]+)`", may))
    kafka = Path(relstream.__file__).parent / "kafka"
    modules = [path.relative_to(kafka) for path in kafka.rglob("*.py")]
    assert {m.parts[0] for m in modules if len(m.parts) > 1} == set(allowed)
    assert [m for m in modules if len(m.parts) == 1] == [Path("__init__.py")]  # all in rooms
    for module in modules:
        if len(module.parts) == 1:
            continue
        room = module.parts[0]
        names = imported((kafka / module).read_text())
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["relstream", "kafka"] and len(parts) > 2 and parts[2] != room:
                assert parts[2] in allowed[room], f"kafka/{module} imports {name}"


def test_the_schedulers_data_has_one_import_path():
    # The plain data a policy sees and returns is imported from `scheduler.data` alone:
    # not through the view, nor the package (they no longer re-export it).
    import ast
    from pathlib import Path

    import relstream
    from relstream.scheduler import data

    names = {n for n, v in vars(data).items() if getattr(v, "__module__", "") == data.__name__}
    names |= {"IDLE"}
    root = Path(relstream.__file__).parents[1]
    offenders = []
    for folder in ("relstream", "relstream_lab", "tests"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(parsed(path.read_text())):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module in ("relstream.scheduler", "relstream.scheduler.view")
                    and {alias.name for alias in node.names} & names
                ):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []


def test_no_test_module_imports_another():
    # Shared helpers live in tests/helpers.py (plain functions and classes) or conftest.py
    # (fixtures): importing a test module runs its module-level code again and ties one
    # test file's edits to another's. Snippets run with `python -c` count too.
    import re
    from pathlib import Path

    importing = re.compile(r"\b(?:from|import)\s+(?:tests\.)?(test_\w+|conftest)\b")
    tests = Path(__file__).parents[1]
    offenders = {
        f"{path.name} imports {name}"
        for path in sorted(tests.rglob("*.py"))
        for name in importing.findall(path.read_text())
    }
    assert offenders == set()


ENGINE_SIDES = {"both processes", "engine core", "service process"}


def engine_module_map() -> dict[str, str]:
    """docs/architecture/engine.md's engine module map: a module of `engine/` -> the
    process it runs in."""
    text = page("engine.md")
    table = text[text.index("| engine module | runs in | holds |") :].split("\n\n")[0]
    rows = [row.strip("|").split("|") for row in table.splitlines()[2:]]
    return {module.strip().strip("`"): runs_in.strip() for module, runs_in, _ in rows}


def engine_imports(path) -> set[str]:
    """The modules of relstream.engine that `path` imports, as paths under engine/ (an
    imported package as its __init__.py)."""
    import ast
    from pathlib import Path

    import relstream

    engine = Path(relstream.__file__).parent / "engine"
    found = set()
    for node in ast.walk(parsed(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if not (name + ".").startswith("relstream.engine."):
                continue
            parts = name.split(".")[2:]
            module, package = engine.joinpath(*parts).with_suffix(".py"), engine.joinpath(*parts)
            if parts and module.is_file():
                found.add(module.relative_to(engine).as_posix())
            elif (package / "__init__.py").is_file():
                found.add((package / "__init__.py").relative_to(engine).as_posix())
    return found


def test_each_engine_module_says_which_process_it_runs_in_and_imports_none_of_the_other():
    # vLLM's engine core loads the plug-in (engine/core/) by its dotted path, in a process
    # of its own; the runtime runs on the service's event loop. Neither imports the
    # other's modules, only engine/tags.py, what both agree on: the module map says which
    # process each module runs in, and each module's docstring begins with it.
    import ast
    from pathlib import Path

    import relstream

    engine = Path(relstream.__file__).parent / "engine"
    runs_in = engine_module_map()
    modules = sorted(path.relative_to(engine).as_posix() for path in engine.rglob("*.py"))
    assert sorted(runs_in) == modules  # every module has its row, every row its module
    assert set(runs_in.values()) <= ENGINE_SIDES
    for module in modules:
        side = runs_in[module]
        if module.startswith("core/"):
            assert side == "engine core", module
        docstring = ast.get_docstring(parsed((engine / module).read_text())) or ""
        assert docstring.lower().startswith(side), f"{module}: {docstring[:60]!r}"
        for target in engine_imports(engine / module) - {module}:
            allowed = {"both processes"} | ({side} - {"both processes"})
            assert runs_in[target] in allowed, f"{module} ({side}) imports {target}"


def test_vllm_is_given_the_plug_ins_path_as_a_string_the_service_never_imports():
    # The runtime names the plug-in only by `tags.PLUGIN_CLASS`; the dotted path names a
    # module of the engine core's side (vLLM resolves it there), and the old path is an
    # alias of it.
    from pathlib import Path

    import relstream
    from relstream.engine.tags import PLUGIN_CLASS

    engine = Path(relstream.__file__).parent / "engine"
    module, _, name = PLUGIN_CLASS.rpartition(".")
    path = engine.joinpath(*module.split(".")[2:]).with_suffix(".py")
    assert engine_module_map()[path.relative_to(engine).as_posix()] == "engine core"
    assert f"def {name}(" in path.read_text()


def test_every_test_module_is_in_a_folder_the_architecture_table_names():
    from pathlib import Path

    tests = Path(__file__).parents[1]
    text = page("README.md")
    table = text[text.index("| test folder | tests |") :].split("\n\n")[0]
    named = {row.strip("|").split("|")[0].strip().strip("`/") for row in table.splitlines()[2:]}
    folders = {path.parent.name for path in tests.rglob("test_*.py")}
    assert folders == named
    assert sorted(path.name for path in tests.glob("test_*.py")) == []


def placement_module_map() -> dict[str, bool]:
    """docs/architecture/placement.md's placement module map: a module of `placement/` ->
    whether it is pure."""
    text = page("placement.md")
    table = text[text.index("| placement module | pure | holds |") :].split("\n\n")[0]
    rows = [row.strip("|").split("|") for row in table.splitlines()[2:]]
    return {module.strip().strip("`"): pure.strip() == "yes" for module, pure, _ in rows}


def test_placements_pure_modules_import_nothing_of_relstream_but_each_other():
    # The scheduler, the simulator and vLLM's engine core import `placement.load`, the lab
    # `placement.choice`: they must not pull in the reports' Kafka side, so a pure module
    # imports only pure modules of its package (and its package imports nothing at all).
    from pathlib import Path

    import relstream

    package = Path(relstream.__file__).parent / "placement"
    pure = placement_module_map()
    assert sorted(pure) == sorted(p.name for p in package.glob("*.py"))
    allowed = {f"relstream.placement.{m.removesuffix('.py')}" for m, p in pure.items() if p}
    for module in (m for m, p in pure.items() if p):
        names = imported((package / module).read_text())
        for name in names:
            if name.split(".")[0] == "relstream":
                assert module != "__init__.py" and name in allowed, f"{module}: {name}"


def test_the_load_an_engine_reports_is_carried_by_the_fewest_types():
    # One number, an engine's outstanding work, once took seven types to travel from the
    # policy to the placer. Now `Load` carries it everywhere, the wire its message, and
    # `relstream status` its row: a new type with the field is one more to keep in step.
    import ast
    from pathlib import Path

    import relstream

    root = Path(relstream.__file__).parent
    carriers = sorted(
        (path.relative_to(root).as_posix(), node.name)
        for path in root.rglob("*.py")
        for node in ast.walk(parsed(path.read_text()))
        if isinstance(node, ast.ClassDef)
        for field in node.body
        if isinstance(field, ast.AnnAssign)
        and isinstance(field.target, ast.Name)
        and field.target.id == "outstanding_s"
    )
    assert carriers == [
        ("kafka/tools/inspect.py", "EngineSeen"),
        ("placement/load.py", "Load"),
        ("wire/messages.py", "LoadReportMessage"),
    ]
