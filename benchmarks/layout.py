"""The house's layout in figures: what the wheel installs at the top level, the biggest modules and
classes, the longest functions. Read statically (ast), from any checkout:

    python -m benchmarks.layout [REPO]      (default: this one)

Issue "The house" quotes it before and after its restructuring (a `git worktree` of the older
commit is a REPO). Not part of `python -m benchmarks all`: it measures code, not a run.
"""

from __future__ import annotations

import ast
import statistics
import sys
import tomllib
from pathlib import Path

ROOMS = ("pipeline", "protos", "workers", "accel", "stoker")


def figures(root: Path) -> dict:
    packages = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    modules, classes, functions = [], [], []
    for folder in ROOMS:
        base = root / folder
        if base.is_symlink() or not base.exists():
            continue
        for path in sorted(base.rglob("*.py")):
            if path.name.endswith("_pb2.py") or any(part in ROOMS for part in path.relative_to(base).parts[:-1]
                                                    if (base / part).is_symlink()):
                continue
            text, where = path.read_text(), str(path.relative_to(root))
            modules.append((len(text.splitlines()), where))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef):
                    methods = sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in node.body)
                    fields = sum(isinstance(n, ast.AnnAssign) for n in node.body)
                    classes.append((methods, fields, f"{where}:{node.name}"))
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    functions.append((node.end_lineno - node.lineno + 1, f"{where}:{node.name}"))
    return {"top_level": sorted({p.split(".")[0] for p in packages}), "modules": len(modules),
            "median_module_lines": statistics.median(n for n, _ in modules),
            "biggest_modules": sorted(modules, reverse=True)[:5], "biggest_classes": sorted(classes, reverse=True)[:5],
            "longest_functions": sorted(functions, reverse=True)[:5],
            "functions_over_60_lines": sum(n > 60 for n, _ in functions),
            "median_function_lines": statistics.median(n for n, _ in functions)}


def main(root: str = ".") -> None:
    found = figures(Path(root))
    print(f"installed at the top level: {', '.join(found['top_level'])}")
    print(f"modules: {found['modules']} (median {found['median_module_lines']:.0f} lines)")
    print("biggest modules: " + ", ".join(f"{p} {n}" for n, p in found["biggest_modules"]))
    print("biggest classes (methods/fields): " + ", ".join(f"{p} {m}/{f}" for m, f, p in found["biggest_classes"]))
    print("longest functions: " + ", ".join(f"{p} {n}" for n, p in found["longest_functions"]))
    print(f"functions over 60 lines: {found['functions_over_60_lines']} (median {found['median_function_lines']:.0f})")


if __name__ == "__main__":
    main(*sys.argv[1:])
