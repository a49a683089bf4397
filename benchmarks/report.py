"""Where every benchmark leaves its figures: benchmarks/results/NAME.json (all of them, with the
versions they ran with) and NAME.md (the table the README quotes)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def write_results(name: str, result: dict, table: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{name}.md").write_text(table)


def versions(*distributions: str) -> dict[str, str]:
    """The installed versions a figure was measured with (see requirements.lock), plus libzmq's."""
    found = {name: importlib.metadata.version(name) for name in ("numpy", "pyarrow", "pyzmq", *distributions)}
    import zmq

    return found | {"libzmq": zmq.zmq_version()}
