"""What docs/, examples/ and the README show a user importing is the public API: `stoker` and its own
modules (stoker.transforms, stoker.datasets, ...), never the rooms it installs under it
(stoker.pipeline, stoker.accel, stoker.workers, stoker.protos), which may change shape."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.rooms import room_of

ROOT = Path(__file__).resolve().parent.parent
CODE_BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def imported(code: str, where: str) -> list[tuple[str, str]]:
    """(where, module) for every import in the code (absolute ones; a relative one is the example's own)."""
    found = []
    for node in ast.walk(ast.parse(code, where)):
        if isinstance(node, ast.Import):
            found += [(f"{where}:{node.lineno}", alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(f"{where}:{node.lineno}", node.module)]
            found += [(f"{where}:{node.lineno}", f"{node.module}.{alias.name}") for alias in node.names]
    return found


def internal(module: str) -> bool:
    """A room of stoker (a bare `accel` is the user's own package: tests/test_bare_imports.py)."""
    return module.startswith("stoker.") and room_of(module.removeprefix("stoker.")) is not None


def shown_code() -> list[tuple[str, str]]:
    """(where, code): every Python file under examples/, every ```python block of the docs and READMEs."""
    shown = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "examples").rglob("*.py"))]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
    for page in pages:
        for number, block in enumerate(CODE_BLOCK.findall(page.read_text()), 1):
            shown.append((f"{page.relative_to(ROOT)} (python block {number})", block))
    return shown


def test_docs_and_examples_import_only_the_public_api():
    code = shown_code()
    assert len(code) > 5  # the examples and the docs' blocks were found
    bad = [f"{where} imports {module}" for name, text in code for where, module in imported(text, name)
           if internal(module)]
    assert bad == [], "import it from stoker or stoker.transforms (add it there if a user needs it)"


def test_the_rule_catches_a_room_however_it_is_spelt():
    planted = ("from stoker.pipeline.images.augment import TrainTransform\nimport stoker.accel.feed\n"
               "from stoker import Loader\nfrom stoker.transforms import Output\n")
    assert [module for _, module in imported(planted, "x.py") if internal(module)] == [
        "stoker.pipeline.images.augment", "stoker.pipeline.images.augment.TrainTransform", "stoker.accel.feed"]
