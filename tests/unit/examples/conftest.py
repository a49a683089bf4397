"""The example packages are not installed in the test environment: import them from their folders,
as `PYTHONPATH=examples/trivialaugment` would on a host that has not run `pip install` yet."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
for folder in (EXAMPLES / "trivialaugment",):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
