"""`pip install .` without -e: a wheel with the C extension and the proto, everything under the one
`stoker` namespace, and a `stoker` command that works from outside the source tree, beside a
training script's own `pipeline`, `protos`, `workers` and `accel` packages.

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
    assert {n.split("/")[0] for n in names} == {"stoker", "stoker-0.1.0.dist-info"}  # one namespace, nothing beside
    in_tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "stoker").rglob("*.py")}
    stale = {n for n in names if n.endswith(".py")} - in_tree
    assert not stale, f"the wheel holds modules the tree does not (a stale build/ folder? make clean): {sorted(stale)}"
    images = "stoker/pipeline/images/"
    assert any(n.startswith(images + "_jpegcrop") and n.endswith(".so") for n in names), "no crop decoder"
    assert any(n.startswith(images + "_jpegrestart") and n.endswith(".so") for n in names), "no transcoder"
    assert {"stoker/protos/stoker_pb2.py", "stoker/protos/stoker.proto", "stoker/cli.py", "stoker/loader.py",
            "stoker/local_workers.py", "stoker/transforms.py", "stoker/pipeline/text/examples.py",
            "stoker/accel/control/service.py"} <= set(names)
    assert {"stoker/py.typed", "stoker/protos/stoker_pb2.pyi", "stoker/pipeline/images/_jpegcrop.pyi",
            "stoker/pipeline/images/_jpegrestart.pyi"} <= set(names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # the heavy dependencies, as installed
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)

    # a training script's folder with packages of its own named as Stoker's rooms are (common in ML repositories)
    outside = tmp_path / "elsewhere"
    for room in ("pipeline", "protos", "workers", "accel"):
        (outside / room).mkdir(parents=True)
        (outside / room / "__init__.py").write_text(f"OWNER = 'the user'\nROOM = {room!r}\n")
        (outside / room / "job.py").write_text("raise ImportError('the user\\'s module, not Stoker\\'s')\n")
    (outside / "train.py").write_text(
        "import accel, pipeline, protos, workers\n"
        "from stoker import JobConfig\n"
        "from stoker.transforms import Output, TrainTransform\n"
        "import stoker, stoker.pipeline.images._jpegcrop as c, stoker.pipeline.images._jpegrestart as r\n"
        "assert {m.OWNER for m in (accel, pipeline, protos, workers)} == {'the user'}\n"
        f"job = JobConfig(manifest_uri={manifest.uri!r}, batch_size=8)\n"
        "assert job.batch_size == 8 and TrainTransform(size=96).outputs['image'] == Output('uint8', (96, 96, 3))\n"
        "print(stoker.__file__); print(c.__file__); print(r.__file__); print(JobConfig.__module__)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROMETHEUS_MULTIPROC_DIR")}
    stoker = str(venv / "bin" / "stoker")
    version = subprocess.run([stoker, "--version"], capture_output=True, text=True, cwd=outside, env=env, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "stoker 0.1.0", version.stderr
    script = subprocess.run([str(venv / "bin" / "python"), "train.py"], capture_output=True, text=True,
                            cwd=outside, env=env, timeout=60)
    assert script.returncode == 0, script.stderr
    *where, module = script.stdout.split()
    assert all(str(site) in path for path in where), where  # the installed copy, not the checkout
    assert module == "stoker.pipeline.job"
    # run from that folder: the worker daemons it starts (python -m stoker, the folder first on their path)
    # still import Stoker's rooms, not the user's packages of the same names
    run = subprocess.run([stoker, "run", "--data", manifest.uri, "--epochs", "1", "--accel", "null", "--no-progress",
                          "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                          "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                         capture_output=True, text=True, cwd=outside, env=env, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"delivered {manifest.num_samples} samples ({manifest.num_samples} unique)" in run.stdout
