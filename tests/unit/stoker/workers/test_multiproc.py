"""stoker/workers/multiproc.py: the metrics folder of a worker daemon, set before prometheus_client loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter: what prometheus_client has loaded is per process."""
    base = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=base | env)


def test_a_fresh_folder_is_made_set_and_removed():
    result = _run("import os\nfrom stoker.workers.multiproc import prepare_multiproc_dir, remove_multiproc_dir\n"
                  "path = prepare_multiproc_dir()\n"
                  "assert os.environ['PROMETHEUS_MULTIPROC_DIR'] == path and os.path.isdir(path)\n"
                  "import prometheus_client\nprometheus_client.Counter('c', 'c').inc()\n"
                  "print(sorted(os.listdir(path)))\nremove_multiproc_dir(path)\nprint(os.path.exists(path))\n")
    assert result.returncode == 0, result.stderr
    files, exists = result.stdout.splitlines()
    assert "counter_" in files and exists == "False"  # the counter was kept in the folder


def test_a_given_folder_is_wiped_of_stale_counts(tmp_path):
    (tmp_path / "counter_123.db").write_bytes(b"stale")
    result = _run("from stoker.workers.multiproc import prepare_multiproc_dir\nprint(prepare_multiproc_dir())",
                  PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path) and list(tmp_path.iterdir()) == []


def test_too_late_after_prometheus_client_loaded():
    result = _run("import prometheus_client\nfrom stoker.workers.multiproc import prepare_multiproc_dir\n"
                  "prepare_multiproc_dir()")
    assert result.returncode != 0 and "imported before its multi-process directory was set" in result.stderr
