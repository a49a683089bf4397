"""The house's rooms as pyproject.toml's [tool.stoker.rooms] lists them: the one list every rule of
the tests reads (benchmarks/layout.py reads the same table)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "stoker"  # the one installed package; the rooms are its folders
# room (a dotted path under stoker) -> the rooms its modules may import
MAY_IMPORT: dict[str, frozenset[str]] = {
    room: frozenset(allowed)
    for room, allowed in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["stoker"]["rooms"].items()}
ROOMS: tuple[str, ...] = tuple(MAY_IMPORT)


def room_of(dotted: str) -> str | None:
    """The room a module or package under stoker belongs to ("accel.control.serving.server" -> "accel.control",
    "pipeline.text.vocab" -> "pipeline"), or None for the modules of stoker/ itself."""
    while dotted and dotted not in MAY_IMPORT:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


SCRATCH = ("benchmarks", "work")  # git-ignored: the benchmarks' downloads and peer environments, not the project


def project_modules(root: Path, folders: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file, for every .py file under `folders` of `root` ("pkg" is pkg/__init__.py), but the
    benchmarks' scratch folder, whose peer environments hold other projects' modules."""
    modules = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[:2] != SCRATCH:
                modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules
