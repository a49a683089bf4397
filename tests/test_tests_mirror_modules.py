"""Tests mirror modules: every module with logic has its unit test file at the mirrored path
(tests/unit/PACKAGE/test_MODULE.py), or is named in COVERED_BY with the tests that exercise it
instead (the daemons, sockets and training steps it only makes sense inside). A new module with
neither fails here.

COVERED_BY is checked, not trusted: each test named for a module must reach that module in the
project's source graph, read statically (ast, nothing imported). The graph's nodes are the .py
files of the packages, tests/, examples/ and benchmarks/; a file has an arrow to
- every project module it imports, anywhere in it (at the top, inside a function, in a try), and
  to the packages above that module (whose __init__ runs first);
- and, in a file under tests/ (that is how a test starts processes): the module a string names,
  "pkg.mod" or "pkg.mod:Name" (`python -m pkg.mod`, a transform spec, importlib), the package's
  __main__ after a "-m" ("-m", "stoker" is `stoker ...`), a script named by its file name
  ("ddp_script.py"), and what a string of code imports (`python -c "from pkg import mod; ..."`);
- and, from a file under tests/, to the conftest fixtures its functions ask for by parameter
  name (the nearest conftest.py that defines one). A fixture has arrows to what it imports in its
  body, to the top-level imports of its conftest that it uses by name, and to the fixtures it asks
  for. A conftest's other imports and its autouse fixtures are no arrow: they run for every test
  and exercise none in particular.
A named test covers a module when the module is reachable from it (a mirrored unit test must
reach its module too). Reachable is necessary, not sufficient: it proves the test can run the
module, and catches an entry that points at a test which never touches it (or at a module
nothing uses any more)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.rooms import project_modules

ROOT = Path(__file__).resolve().parent.parent
GRAPH_FOLDERS = ("stoker", "tests", "examples", "benchmarks")  # the product (stoker/ and its rooms) and its users
E2E = "tests/integration/"
# module -> where it is exercised instead (the daemons, sockets and training steps it drives)
COVERED_BY = {
    "stoker/pipeline/images/layout": ["tests/unit/stoker/pipeline/test_kinds.py"],
    "stoker/pipeline/images/photos": ["tests/unit/stoker/pipeline/test_prepare.py"],
    "stoker/pipeline/images/synth": ["tests/unit/stoker/pipeline/test_prepare.py"],
    "stoker/pipeline/tensors": ["tests/unit/stoker/pipeline/test_kinds.py"],
    "stoker/pipeline/units": ["tests/unit/stoker/pipeline/test_plan.py"],
    "stoker/pipeline/text/layout": ["tests/unit/stoker/pipeline/text/test_packing.py"],
    "stoker/workers/process": [E2E + "test_exactly_once.py", E2E + "test_lifecycle.py"],
    "stoker/accel/backends/accelerators": ["tests/unit/stoker/accel/test_stepping.py"],
    "stoker/protos/aio": [E2E + "test_exactly_once.py"],
    "stoker/accel/batch": [E2E + "test_text_job.py"],
    "stoker/accel/backends/bert_accel": [E2E + "test_torch_step.py"],
    "stoker/accel/control/link": ["tests/unit/stoker/accel/test_consumer.py",
                                  "tests/unit/stoker/accel/test_joining.py"],
    "stoker/accel/control/metrics": [E2E + "test_deploy.py", E2E + "test_dispatch.py"],
    "stoker/accel/control/service": [E2E + "test_dispatch.py"],
    "stoker/accel/fleet/service": [E2E + "test_fleet.py"],
    "stoker/accel/fleet/config": [E2E + "test_fleet.py", "tests/unit/stoker/test_options.py"],
    "stoker/accel/control/serving/control_socket": ["tests/unit/stoker/accel/control/serving/test_server.py",
                                                    E2E + "test_fleet.py"],
    "stoker/accel/control/serving/worker_handlers": ["tests/unit/stoker/accel/control/serving/test_server.py"],
    "stoker/accel/control/serving/rank_handlers": ["tests/unit/stoker/accel/control/serving/test_server.py",
                                           "tests/unit/stoker/accel/control/test_local.py"],
    "stoker/workers/fleet_agent": [E2E + "test_fleet.py"],
    "stoker/lab/fleet_lab": [E2E + "test_lab.py"],
    "stoker/accel/jpeg_decode": [E2E + "test_decode_on_accelerator.py", E2E + "test_awkward_jpegs.py"],
    "stoker/accel/metrics": [E2E + "test_deploy.py", "tests/unit/stoker/accel/test_receiver.py"],
    "stoker/accel/backends/models/resnet": [E2E + "test_torch_step.py"],
    "stoker/accel/backends/optimizers": [E2E + "test_torch_step.py"],
    "stoker/accel/backends/profiles": ["tests/unit/stoker/accel/test_stepping.py",
                                       "tests/unit/stoker/test_planning.py"],
    "stoker/accel/rank_report": ["tests/unit/stoker/accel/test_consumer.py", E2E + "test_bottleneck.py"],
    "stoker/accel/receive_loop": ["tests/unit/stoker/accel/test_consumer.py", E2E + "test_exactly_once.py"],
    "stoker/accel/schema": ["tests/unit/stoker/accel/test_receiver.py", "tests/unit/stoker/workers/test_sources.py"],
    "stoker/accel/steps": [E2E + "test_data_parallel.py"],
    "stoker/accel/stream": ["tests/unit/stoker/accel/test_receiver.py", E2E + "test_data_parallel.py"],
    "stoker/accel/backends/torch_accel": [E2E + "test_torch_step.py"],
    "stoker/accel/backends/training": [E2E + "test_torch_step.py"],
    "stoker/accel/training_loop": [E2E + "test_torch_step.py", E2E + "test_exactly_once.py"],
    "stoker/cli": [E2E + "test_flags.py", "tests/unit/stoker/test_options.py"],
    "stoker/commands/audit": ["tests/unit/stoker/accel/test_step_record.py", E2E + "test_local_workers.py"],
    "stoker/commands/calibrate": [E2E + "test_plan_check.py"],
    "stoker/commands/data": [E2E + "test_flags.py"],
    "stoker/commands/dispatch": [E2E + "test_flags.py", E2E + "test_dispatch.py"],
    "stoker/commands/fleet": [E2E + "test_flags.py", E2E + "test_fleet.py"],
    "stoker/commands/keys": [E2E + "test_curve.py"],
    "stoker/commands/lab": [E2E + "test_lab.py"],
    "stoker/commands/plan": ["tests/unit/stoker/test_planning.py"],
    "stoker/commands/run": [E2E + "test_flags.py", "tests/unit/stoker/test_options.py"],
    "stoker/commands/status": [E2E + "test_bottleneck.py"],
    "stoker/commands/sweep": [E2E + "test_flags.py"],
    "stoker/commands/train": [E2E + "test_flags.py", "tests/unit/stoker/test_options.py"],
    "stoker/commands/worker": [E2E + "test_flags.py", "tests/unit/stoker/workers/test_worker_config.py"],
    "stoker/lab/cluster": [E2E + "test_lab.py"],
    "stoker/lab/processes": [E2E + "test_lab.py"],
    "stoker/lab/state": [E2E + "test_lab.py"],
    "stoker/local_workers": [E2E + "test_local_workers.py", E2E + "test_exactly_once.py"],
    "stoker/lab/system": [E2E + "test_lab.py"],
}


def _with_packages(name: str, modules: dict[str, Path]) -> set[str]:
    """`name` and the packages above it, those of them that are project modules."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imported(node: ast.AST, name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules one import statement (or importlib.import_module("...") call) loads."""
    if isinstance(node, ast.Import):
        return set().union(*(_with_packages(alias.name, modules) for alias in node.names))
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = _package_of(name, path).split(".")
            package = package[:len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        return _with_packages(base, modules).union(
            *(_with_packages(f"{base}.{alias.name}", modules) for alias in node.names))
    if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return _with_packages(node.args[0].value, modules)
    return set()


def _started(node: ast.AST, name: str, path: Path, modules: dict[str, Path], scripts: dict[str, str]) -> set[str]:
    """The project modules a string in a test starts: "pkg.mod[:Name]", "-m" "pkg", "script.py", or code
    (`python -c "from pkg import mod ..."`) that imports them."""
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [elt.value if isinstance(elt, ast.Constant) else None for elt in node.elts]
        return {f"{package}.__main__" for flag, package in zip(values, values[1:], strict=False)
                if flag == "-m" and f"{package}.__main__" in modules}
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return set()
    head = node.value.partition(":")[0]
    if "." in head and head in modules:
        return _with_packages(head, modules)
    if node.value in scripts:
        return {scripts[node.value]}
    if "import " not in node.value:
        return set()
    try:
        code = ast.parse(node.value)
    except SyntaxError:  # prose that mentions importing
        return set()
    return set().union(*(_imported(n, name, path, modules) for n in ast.walk(code)))


def _is_fixture(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list)


def _conftests_above(path: Path, root: Path, modules: dict[str, Path]) -> list[str]:
    """The conftest modules pytest loads for a file under tests/, nearest first."""
    found = []
    for folder in path.parents:
        name = ".".join((folder / "conftest").relative_to(root).parts)
        if name in modules:
            found.append(name)
        if folder == root / "tests":
            return found
    return found


def _fixture_arrows(name: str, path: Path, modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each fixture of a conftest ("CONFTEST::NAME") -> the modules it imports (in its body, or by a
    top-level name it uses) and a "fixture:NAME" for each fixture it asks for (resolved by the caller)."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.setdefault((alias.asname or alias.name).split(".")[0], set()).update(
                    _imported(node, name, path, modules))
    fixtures = {}
    for node in tree.body:
        if _is_fixture(node):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            arrows = set().union(*(_imported(n, name, path, modules) for n in ast.walk(node)),
                                 *(bound[n] for n in used & bound.keys()))
            fixtures[f"{name}::{node.name}"] = arrows | {f"fixture:{arg.arg}" for arg in node.args.args}
    return fixtures


@functools.cache
def source_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module (or "conftest::fixture") -> the project modules and fixtures it imports, starts or asks for."""
    modules = project_modules(root, GRAPH_FOLDERS)
    names = [path.name for path in modules.values()]
    scripts = {path.name: name for name, path in modules.items()
               if names.count(path.name) == 1 and path.name not in ("__init__.py", "__main__.py")}
    graph: dict[str, set[str]] = {}
    asks: dict[str, set[str]] = {}  # a file or fixture under tests/ -> the fixture names it asks for
    conftests: dict[str, list[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        in_tests = path.relative_to(root).parts[0] == "tests"
        if path.name == "conftest.py":  # pytest loads it; a test reaches only the fixtures it names
            graph[name] = set()
            for fixture, arrows in _fixture_arrows(name, path, modules).items():
                graph[fixture] = {a for a in arrows if not a.startswith("fixture:")}
                asks[fixture] = {a.removeprefix("fixture:") for a in arrows if a.startswith("fixture:")}
                conftests[fixture] = _conftests_above(path, root, modules)
            continue
        arrows: set[str] = set()
        parameters: set[str] = set()  # what the file's functions take: the fixtures its tests ask for
        for node in ast.walk(tree):
            arrows |= _imported(node, name, path, modules)
            if in_tests:
                arrows |= _started(node, name, path, modules, scripts)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    parameters |= {arg.arg for arg in node.args.args}
        graph[name] = arrows - {name}
        if in_tests:
            asks[name], conftests[name] = parameters, _conftests_above(path, root, modules)
    for node, wanted in asks.items():
        for fixture in wanted:
            graph[node] |= next(({f"{c}::{fixture}"} for c in conftests[node] if f"{c}::{fixture}" in graph), set())
    return graph


def reaches(test: str, module: str, root: Path = ROOT) -> bool:
    """Whether the test file (a path from the root) reaches the module ("package/module") in the graph."""
    graph = source_graph(root)
    start, goal = Path(test).with_suffix("").as_posix().replace("/", "."), module.replace("/", ".")
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return goal in seen


def wrong_entries(covered_by: dict[str, list[str]], root: Path = ROOT) -> list[str]:
    """Every (module, test) pair of an exemption list whose test never reaches its module."""
    return [f"{test} never reaches {module}" for module, tests in covered_by.items() for test in tests
            if (root / test).exists() and not reaches(test, module, root)]


def modules_with_logic() -> list[str]:
    found = []
    for path in sorted((ROOT / "stoker").rglob("*.py")):  # the product: stoker/ and its rooms
        if path.name in ("__init__.py", "__main__.py") or path.name.endswith("_pb2.py"):
            continue
        if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               for node in ast.parse(path.read_text()).body):
            found.append(path.relative_to(ROOT).with_suffix("").as_posix())
    return found


def unit_test_of(module: str) -> Path:
    folder, _, name = module.rpartition("/")
    return ROOT / "tests" / "unit" / folder / f"test_{name.lstrip('_')}.py"


def test_every_module_with_logic_is_tested_at_its_mirror_or_says_where():
    untested = [m for m in modules_with_logic() if not unit_test_of(m).exists() and m not in COVERED_BY]
    assert untested == [], "write tests/unit/.../test_MODULE.py for these (or say in COVERED_BY where they run)"


def test_every_mirrored_unit_test_reaches_its_module():
    astray = [m for m in modules_with_logic() if unit_test_of(m).exists()
              and not reaches(unit_test_of(m).relative_to(ROOT).as_posix(), m)]
    assert astray == [], "these modules' unit tests never import them"


def test_the_list_of_exceptions_points_at_real_tests_and_does_not_go_stale():
    modules = set(modules_with_logic())
    for module, tests in COVERED_BY.items():
        assert module in modules, f"{module} is gone or has no logic: drop it from COVERED_BY"
        assert not unit_test_of(module).exists(), f"{module} has its unit test now: drop it from COVERED_BY"
        for test in tests:
            assert (ROOT / test).exists(), f"{test} (for {module}) does not exist"
    assert wrong_entries(COVERED_BY) == [], "point these at a test that reaches the module, or write its unit test"


def test_a_planted_entry_whose_test_never_reaches_its_module_is_caught():
    planted = {"stoker/workers/daemon": ["tests/unit/stoker/pipeline/test_plan.py"],  # plans epochs, starts no daemon
               "stoker/protos/curve": [E2E + "test_curve.py"]}  # right: it runs `stoker keys` and imports protos.curve
    assert wrong_entries(planted) == ["tests/unit/stoker/pipeline/test_plan.py never reaches stoker/workers/daemon"]


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_source_graph_follows_lazy_imports_processes_scripts_and_fixtures(tmp_path):
    _write(tmp_path, {
        "stoker/pipeline/__init__.py": "", "stoker/pipeline/lazy.py": "def f():\n    from . import deep\n",
        "stoker/pipeline/deep.py": "", "stoker/pipeline/alone.py": "", "stoker/pipeline/by_name.py": "",
        "stoker/pipeline/fixed.py": "",
        "stoker/pipeline/unused_by_fixture.py": "",
        "stoker/__init__.py": "", "stoker/__main__.py": "from stoker import cli\n", "stoker/cli.py": "",
        "tests/__init__.py": "", "tests/tool.py": "import stoker.pipeline.alone\n",
        "tests/conftest.py": "from stoker.pipeline import fixed\nfrom stoker.pipeline import unused_by_fixture\n"
                             "import pytest\n\n"
                             "@pytest.fixture\ndef data():\n    return fixed\n",
        "tests/test_lazy.py": "def test():\n    import stoker.pipeline.lazy\n",
        "tests/test_cli.py": "CMD = ['python', '-m', 'stoker', 'run']\n",
        "tests/test_script.py": "SCRIPT = 'tool.py'\nSPEC = 'stoker.pipeline.by_name:Thing'\n"
                                "CODE = 'from stoker.pipeline import in_code; in_code.run()'\n",
        "stoker/pipeline/in_code.py": "",
        "tests/test_fixture.py": "def test(data):\n    assert data\n",
    })
    assert reaches("tests/test_lazy.py", "stoker/pipeline/deep", tmp_path)  # a lazy import of a lazy import
    assert reaches("tests/test_cli.py", "stoker/cli", tmp_path)  # `python -m stoker`
    assert reaches("tests/test_script.py", "stoker/pipeline/alone", tmp_path)  # a script it runs by file name
    assert reaches("tests/test_script.py", "stoker/pipeline/by_name", tmp_path)  # a module named in a string
    assert reaches("tests/test_script.py", "stoker/pipeline/in_code", tmp_path)  # code it runs with python -c
    assert reaches("tests/test_fixture.py", "stoker/pipeline/fixed", tmp_path)  # through the fixture it asks for
    assert not reaches("tests/test_fixture.py", "stoker/pipeline/unused_by_fixture", tmp_path)
    assert not reaches("tests/test_lazy.py", "stoker/pipeline/alone", tmp_path)
    assert not reaches("tests/test_cli.py", "stoker/pipeline/deep", tmp_path)
    assert wrong_entries({"stoker/pipeline/deep": ["tests/test_cli.py", "tests/test_lazy.py"]}, tmp_path) == [
        "tests/test_cli.py never reaches stoker/pipeline/deep"]
