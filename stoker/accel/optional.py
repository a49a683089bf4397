"""Accelerator-side dependencies a worker host need not have (DALI, PyTorch): a missing one is a line
that names the install bringing it, said where the feature is asked for, not an ImportError deep in a run."""

from __future__ import annotations

import importlib.util

from stoker.protos.errors import StateError


def require(module: str, feature: str) -> None:
    """An accelerator-side dependency a worker host need not have: say which install brings it."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise StateError(f"{feature} needs {module}, which is not installed: pip install 'stoker[accel]' "
                         f"(worker hosts need only 'stoker')")
