"""`stoker`'s public surface: every name loads lazily from the module the table names, type
checkers see the same names (the TYPE_CHECKING imports), each has a docstring, and the
packages say they are typed (py.typed; that the wheel carries it is tests/integration/test_wheel.py)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import stoker

ROOT = Path(__file__).resolve().parents[3]


def _checker_imports() -> dict[str, str]:
    """name -> module, from the `if TYPE_CHECKING:` block of stoker/__init__.py."""
    tree = ast.parse((ROOT / "stoker" / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) and node.module
            for alias in node.names}


def test_all_is_the_table_and_the_checkers_see_the_same_names_from_the_same_modules():
    assert stoker.__all__ == sorted(stoker._WHERE)
    assert _checker_imports() == stoker._WHERE


def _undocumented(name: str, module: str) -> list[str]:
    """The class and its public methods and properties that have no docstring of their own (read
    from the source: a dataclass's generated __doc__ does not count)."""
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    node = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name)
    members = [m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
               and not m.name.startswith("_")]
    missing = [f"{name}.{m.name}" for m in members if not ast.get_docstring(m)]
    return missing if ast.get_docstring(node) else [name, *missing]


def test_every_public_name_is_the_defining_modules_object_and_it_and_its_members_have_docstrings():
    undocumented = []
    for name, module in stoker._WHERE.items():
        assert getattr(stoker, name) is getattr(importlib.import_module(module), name)
        undocumented += _undocumented(name, module)
    assert undocumented == []


def test_the_errors_a_user_catches_are_exceptions():
    for name in ("JobFailed", "RankRefused", "NotAConsumer", "TransformError", "TransformRefused",
                 "TransformOutputError", "CheckpointError", "JobSecretError", "UntrustedSecret"):
        assert issubclass(getattr(stoker, name), Exception), name


def test_an_unknown_name_is_an_attribute_error_and_import_stoker_loads_no_torch():
    try:
        stoker.NoSuchName  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("stoker.NoSuchName resolved")
    code = "import sys, stoker; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_the_one_package_is_marked_typed_once():
    """PEP 561: the marker at stoker/ types every room under it."""
    assert [p.relative_to(ROOT).as_posix() for p in ROOT.glob("stoker/**/py.typed")] == ["stoker/py.typed"]
