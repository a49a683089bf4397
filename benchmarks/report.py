"""Where every benchmark leaves its figures: benchmarks/results/NAME.json (all of them, with the
versions they ran with) and NAME.md (the table the README quotes)."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def write_results(name: str, result: dict, table: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{name}.md").write_text(table)
