"""Every module has one name: a room of stoker is imported as `stoker.<room>`, never by its bare name,
anywhere in the tree (product, tests, benchmarks, examples, docs, configs). With a checkout's root on
sys.path a bare `from accel.credit import CreditBook` once loaded a second copy of the module and its
classes, and a probe that patched `accel.backends.accelerators` patched nothing the CLI used."""

from __future__ import annotations

import ast
import re
import subprocess

from tests.rooms import ROOMS, ROOT

TOPS = sorted({room.split(".")[0] for room in ROOMS})
_NAME = "|".join(TOPS)
# an import in code or prose (`from accel.x import`, `import pipeline`), a `python -m workers.x`, or a
# "module:Name" spec (an entry point, a transform) that starts at a room
BARE = re.compile(rf"(?<![\w.])(?:from\s+|(?<!stoker )import\s+|-m\s+)(?:{_NAME})(?:\.\w+)*\b(?!\s*/)"
                  rf"|(?<![\w./\-])(?:{_NAME})(?:\.\w+)+:[A-Za-z_]")
DOTTED = re.compile(rf"(?:{_NAME})(?:\.\w+)*(?::\w+)?")  # a whole string that names a module by its room
LOADERS = {"patch", "setattr", "import_module", "run_module", "__import__", "resolve_name"}  # calls that load it
# where a bare name is meant: the wheel test's training script imports its OWN packages named as
# Stoker's rooms, to show they do not collide with the installed stoker; and this rule's own examples
THE_USERS_OWN = {"tests/integration/test_wheel.py", "tests/test_bare_imports.py"}


def bare_imports_in_code(path: str, text: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(text, path)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [f"{path}:{node.lineno} imports {name}" for name in names if name.split(".")[0] in TOPS]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # code a test runs: python -c "..."
            found += [f"{path}:{node.lineno} {hit.split(' ', 1)[1]}" for hit in bare_names_in_text(path, node.value)]
            found += [f"{path}:{node.lineno} {hit.split(' ', 1)[1]}" for hit in _bare_imports_in_string(node.value)]
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in LOADERS \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and DOTTED.fullmatch(node.args[0].value):  # a patch target, import_module's or runpy's argument
            found.append(f"{path}:{node.lineno} names {node.args[0].value}")
    return found


def _bare_imports_in_string(text: str) -> list[str]:
    """What a string that is Python code (`import a, b` included) imports by a room's bare name."""
    if "import" not in text:
        return []
    try:
        code = ast.parse(text)
    except SyntaxError:  # prose, or a fragment
        return []
    return bare_imports_in_code("-c", ast.unparse(code)) if code.body else []


def bare_names_in_text(path: str, text: str) -> list[str]:
    return [f"{path}:{number} {match.group(0)!r}" for number, line in enumerate(text.splitlines(), 1)
            for match in BARE.finditer(line)]


def tracked_text_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [name for name in listed if name.endswith((".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".in"))
            and not name.startswith("benchmarks/results/") and (ROOT / name).is_file()]


def test_no_room_is_imported_by_its_bare_name_anywhere_in_the_tree():
    found = []
    for name in tracked_text_files():
        if name in THE_USERS_OWN:
            continue
        text = (ROOT / name).read_text()
        if name.endswith(".py"):
            found += bare_imports_in_code(name, text)
        found += bare_names_in_text(name, text)
    assert found == [], "spell these stoker.<room>..."


def test_the_rule_sees_each_shape_of_a_bare_name():
    code = ("import accel\nfrom pipeline.job import JobConfig\nimport stoker.accel.feed\nfrom stoker import protos\n"
            "CODE = 'import os\\nfrom workers.multiproc import prepare'\n"
            "LIGHT = 'import sys, stoker, workers.daemon'\n"
            "mock.patch('accel.backends.accelerators.require')\n")
    assert bare_imports_in_code("x.py", code) == ["x.py:1 imports accel", "x.py:2 imports pipeline.job",
                                                  "x.py:5 'from workers.multiproc'", "x.py:5 imports workers.multiproc",
                                                  "x.py:6 imports workers.daemon",
                                                  "x.py:7 names accel.backends.accelerators.require"]
    prose = ("run `python -m workers.daemon` or `--transform pipeline.images.augment:TrainTransform`;\n"
             "see stoker/accel/feed.py, `stoker.pipeline.images.augment:TrainTransform`, "
             "`from stoker.protos import x`;\n"
             "the workers/ keys, the accel/ room, a pipeline of transforms imports numpy, workers.bad:2 at a line\n")
    assert bare_names_in_text("x.md", prose) == ["x.md:1 '-m workers.daemon'", "x.md:1 'pipeline.images.augment:T'"]
