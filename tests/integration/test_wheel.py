"""`pip install .` without -e: a wheel with the C extension and the proto, and a `stoker` command
that works from outside the source tree.

The wheel goes into a fresh venv that sees this environment's already-installed dependencies
(a .pth line), with `--no-deps`, so nothing is downloaded; the job then runs from a folder
that is not the checkout, so only the installed copy can be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_the_wheel_installs_and_runs_a_job_outside_the_source_tree(manifest, tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist)], check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("stoker-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("pipeline/_jpegcrop") and n.endswith(".so") for n in names), "no crop decoder"
    assert any(n.startswith("pipeline/_jpegrestart") and n.endswith(".so") for n in names), "no transcoder"
    assert {"protos/stoker_pb2.py", "protos/stoker.proto", "stoker/cli.py", "accel/loader.py"} <= set(names)
    typed = {f"{package}/py.typed" for package in ("stoker", "pipeline", "workers", "accel", "protos")}
    assert typed | {"protos/stoker_pb2.pyi", "pipeline/_jpegcrop.pyi", "pipeline/_jpegrestart.pyi"} <= set(names)
    assert not any(n.startswith("tests/") or n.startswith("benchmarks/") for n in names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the heavy dependencies, as installed
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROMETHEUS_MULTIPROC_DIR")}
    stoker = str(venv / "bin" / "stoker")
    version = subprocess.run([stoker, "--version"], capture_output=True, text=True, cwd=outside, env=env, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "stoker 0.1.0", version.stderr
    code = ("import stoker, pipeline._jpegcrop as c, pipeline._jpegrestart as r; "
            "print(stoker.__file__); print(c.__file__); print(r.__file__)")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                           cwd=outside, env=env, timeout=60, check=True).stdout.split()
    assert all(str(site) in path for path in where), where  # the installed copy, not the checkout
    run = subprocess.run([stoker, "run", "--data", manifest.uri, "--epochs", "1", "--accel", "null", "--no-progress",
                          "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                          "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                         capture_output=True, text=True, cwd=outside, env=env, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"delivered {manifest.num_samples} samples ({manifest.num_samples} unique)" in run.stdout
