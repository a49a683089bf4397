"""The house's layout in figures: its packages and how many modules each holds directly, the arrows
between them, the biggest modules and classes, the longest functions, and what is over the house's
limits. Read statically (ast), from any checkout, older shapes included (rooms as top-level folders
linked from stoker/ are followed through the links, as the wheel installs them):

    python -m benchmarks.layout [REPO]      (default: this one)

Issue "The house, step 2" quotes it before and after its restructuring (a `git worktree` of the older
commit is a REPO). Not part of `python -m benchmarks all`: it measures code, not a run.
"""

from __future__ import annotations

import ast
import os
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

MOST_MODULE_LINES, MOST_METHODS, MOST_FUNCTION_LINES, MOST_MODULES = 450, 20, 60, 25


@dataclass
class House:
    package_modules: Counter[str] = field(default_factory=Counter)  # package -> modules it holds directly
    modules: list[tuple[int, str]] = field(default_factory=list)  # (lines, path)
    classes: list[tuple[int, str]] = field(default_factory=list)  # (methods, path:Class)
    functions: list[tuple[int, str]] = field(default_factory=list)  # (lines, path:function)
    arrows: Counter[tuple[str, str]] = field(default_factory=Counter)  # (package, package it imports) -> imports


def product_files(root: Path) -> list[tuple[str, Path]]:
    """(dotted package, file) of every product module under stoker/, links followed; generated code out."""
    found = []
    for folder, _, files in os.walk(root / "stoker", followlinks=True):
        package = ".".join(Path(folder).relative_to(root).parts)
        found += [(package, Path(folder) / name) for name in sorted(files)
                  if name.endswith(".py") and not name.endswith("_pb2.py")]
    return found


def _package_of(target: str, packages: set[str]) -> str | None:
    while target and target not in packages:
        target = target.rpartition(".")[0]
    return target or None


def measure(root: Path) -> House:
    house = House()
    files = product_files(root)
    packages = {package for package, _ in files}
    for package, path in files:
        text, where = path.read_text(), f"{package.replace('.', '/')}/{path.name}"
        house.package_modules[package] += path.name != "__init__.py"
        house.modules.append((len(text.splitlines()), where))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
                house.classes.append((methods, f"{where}:{node.name}"))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                house.functions.append(((node.end_lineno or node.lineno) - node.lineno + 1, f"{where}:{node.name}"))
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                for name in names:
                    target = _package_of(name, packages)
                    if target and target != package and name.startswith("stoker."):
                        house.arrows[(package, target)] += 1
    return house


def report(house: House) -> list[str]:
    over = {"modules over 450 lines": [p for n, p in house.modules if n > MOST_MODULE_LINES],
            "classes over 20 methods": [p for n, p in house.classes if n > MOST_METHODS],
            "functions over 60 lines": [p for n, p in house.functions if n > MOST_FUNCTION_LINES],
            "packages over 25 modules": [p for p, n in house.package_modules.items() if n > MOST_MODULES]}
    lines = [f"modules: {len(house.modules)} (median {statistics.median(n for n, _ in house.modules):.0f} lines), "
             f"{sum(n for n, _ in house.modules)} lines in all",
             "packages (modules held directly): " + ", ".join(
                 f"{p} {n}" for p, n in sorted(house.package_modules.items())),
             "biggest modules: " + ", ".join(f"{p} {n}" for n, p in sorted(house.modules, reverse=True)[:6]),
             "biggest classes (methods): " + ", ".join(f"{p} {n}" for n, p in sorted(house.classes, reverse=True)[:5]),
             "longest functions: " + ", ".join(f"{p} {n}" for n, p in sorted(house.functions, reverse=True)[:5]),
             f"arrows between packages: {len(house.arrows)} pairs, {sum(house.arrows.values())} imports"]
    lines += [f"  {a} -> {b}: {n}" for (a, b), n in sorted(house.arrows.items())]
    lines += [f"{what}: {len(found)}" + (f" ({', '.join(found)})" if found else "") for what, found in over.items()]
    return lines


def main(root: str = ".") -> None:
    print("\n".join(report(measure(Path(root)))))


if __name__ == "__main__":
    main(*sys.argv[1:])
