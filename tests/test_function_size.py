"""Parts small enough to hold: no function or method of the product is longer than 60 lines
(docstring and all). A longer one is split into the steps it takes, each named."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOST_LINES = 60


def long_functions(root: Path = ROOT, most: int = MOST_LINES) -> list[str]:
    found = []
    for path in sorted((root / "stoker").rglob("*.py")):  # the product: stoker/ and its rooms
        if path.name.endswith("_pb2.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > most:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_product_function_is_over_sixty_lines():
    assert long_functions() == []


def test_the_check_sees_a_long_one(tmp_path):
    (tmp_path / "stoker" / "pipeline").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(MOST_LINES))
    (tmp_path / "stoker" / "pipeline" / "big.py").write_text(f"def big():\n{body}\n")
    assert long_functions(tmp_path) == [f"stoker/pipeline/big.py:1 big ({MOST_LINES + 1} lines)"]
