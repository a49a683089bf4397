"""The house's rooms and which way its arrows may point.

pipeline/ (data, no sockets) is the floor; protos/ (the wire: messages, sockets, keys, the job as
it travels) stands on it; workers/ (CPU hosts) and accel/ (the consumer) each stand on both and
never on each other; the control plane in accel/control/ is used by the consumer and uses none
of it. stoker/ (the CLI), benchmarks/ and tests/ sit on top. Every import is read from the
source, including imports inside functions, so a lazy import cannot hide an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAY_IMPORT = {
    "pipeline": {"pipeline"},
    "protos": {"protos", "pipeline"},
    "workers": {"workers", "protos", "pipeline"},
    "accel": {"accel", "protos", "pipeline"},
}
OURS = {"pipeline", "protos", "workers", "accel", "stoker", "benchmarks", "tests"}
# what the control plane may use from the rest of accel/: the job and small shared pieces, not the consumer
CONTROL_MAY_USE = {"accel.control", "protos.job", "accel.aio", "accel.checkpoint"}


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; spell the package out")
    return found


def broken_arrows(package: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        seen = set()
        for line, target in imports_of(path):
            top = target.split(".")[0]
            if top in OURS and top not in MAY_IMPORT[package] and (line, top) not in seen:
                seen.add((line, top))
                bad.append(f"{name}:{line} imports {target}")
            if name.startswith("accel.control.") and target.startswith("accel.") and _is_module(root, target) \
                    and not any(target == ok or target.startswith(ok + ".") for ok in CONTROL_MAY_USE):
                bad.append(f"{name}:{line} imports {target} (the control plane uses no consumer code)")
    return bad


def _is_module(root: Path, dotted: str) -> bool:
    where = root / Path(*dotted.split("."))
    return where.with_suffix(".py").exists() or where.is_dir()


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_no_upward_or_sideways_import(package):
    assert broken_arrows(package) == []


def test_the_walk_catches_an_arrow(tmp_path):
    """The check itself: a lazy import of the consumer from a worker, and the control plane
    importing the receiver, are both found."""
    for package in ("workers", "accel/control"):
        (tmp_path / package).mkdir(parents=True)
    (tmp_path / "workers" / "bad.py").write_text("def f():\n    from accel.consumer import Consumer\n")
    (tmp_path / "accel" / "receiver.py").write_text("")
    (tmp_path / "accel" / "control" / "bad.py").write_text("from accel import receiver\n")
    assert broken_arrows("workers", tmp_path) == ["workers.bad:2 imports accel.consumer"]
    assert broken_arrows("accel", tmp_path) == [
        "accel.control.bad:1 imports accel.receiver (the control plane uses no consumer code)"]
