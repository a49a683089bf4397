"""Prometheus multi-process mode for the worker daemon and its children.

prometheus_client picks its value storage when it is first imported, so the directory must
be in the environment before that import, in the daemon and (inherited) in every child.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

ENV = "PROMETHEUS_MULTIPROC_DIR"
_PREFIX = "stoker-worker-metrics-"


def prepare_multiproc_dir() -> str:
    """Use $PROMETHEUS_MULTIPROC_DIR (wiped: stale files would add old counts) or a fresh one,
    which `remove_multiproc_dir` deletes when the daemon is done."""
    if "prometheus_client" in sys.modules and ENV not in os.environ:
        raise RuntimeError("prometheus_client was imported before its multi-process directory was set")
    path = os.environ.get(ENV)
    if path:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, exist_ok=True)
    else:
        path = tempfile.mkdtemp(prefix=_PREFIX)
        os.environ[ENV] = path
    return path


def remove_multiproc_dir(path: str) -> None:
    """Delete the folder prepare_multiproc_dir made (call only when $PROMETHEUS_MULTIPROC_DIR was unset)."""
    shutil.rmtree(path, ignore_errors=True)
