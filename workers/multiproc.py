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


def prepare_multiproc_dir() -> str:
    """Use $PROMETHEUS_MULTIPROC_DIR (wiped: stale files would add old counts) or a fresh one."""
    if "prometheus_client" in sys.modules and ENV not in os.environ:
        raise RuntimeError("prometheus_client was imported before its multi-process directory was set")
    path = os.environ.get(ENV)
    if path:
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, exist_ok=True)
    else:
        path = tempfile.mkdtemp(prefix="stoker-worker-metrics-")
        os.environ[ENV] = path
    return path
