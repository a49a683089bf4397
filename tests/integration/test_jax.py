"""JAX users: `format="jax"` gives jax arrays with the same pixels as NumPy, and the processes of a
jax.distributed job are ranks of one Stoker job without torchrun's variables."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from stoker import Loader
from stoker.accel.consumer_config import ConsumerConfig
from stoker.pipeline.job import JobConfig
from tests.helpers import Daemon, free_port

SCRIPT = Path(__file__).parents[1] / "jax_script.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "PROMETHEUS_MULTIPROC_DIR", "STOKER_JOB_SECRET")}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    return env


def test_format_jax_gives_jax_arrays_with_the_pixels_numpy_gets(manifest, tmp_path, log_dir):
    """The same job (seed 3) once through format="jax" (in a process of its own) and once through
    format="numpy" here: the same samples in every step, the same bytes in every image array."""
    port = free_port()
    daemon = Daemon(f"tcp://127.0.0.1:{port}", "jax-host", 1, log_dir)
    done = subprocess.run([sys.executable, str(SCRIPT), "one", str(port), manifest.uri, str(tmp_path)], env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert daemon.wait(timeout=30) == 0, daemon.output()[-3000:]
    as_jax = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    port = free_port()
    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{port}", metrics_port=None)
    job = JobConfig(manifest_uri=manifest.uri, batch_size=16, image_size=32, seed=3)
    daemon = Daemon(f"tcp://127.0.0.1:{port}", "numpy-host", 1, log_dir)
    with Loader(job, config=config, format="numpy", rank=0, world_size=1) as loader:
        as_numpy = [{"ids": b.sample_ids.tolist(), "sha256": hashlib.sha256(b["image"].tobytes()).hexdigest()}
                    for b in loader]
    assert daemon.wait(timeout=30) == 0, daemon.output()[-3000:]
    assert as_jax == as_numpy and len(as_jax) == 10


def test_a_jax_distributed_job_gets_its_ranks_from_jax_and_every_sample_once(manifest, tmp_path, log_dir):
    env = _env()
    coordinator, control = free_port(), free_port()
    daemons = [Daemon(f"tcp://127.0.0.1:{control}", f"host{i}", 1, log_dir) for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(i), "2", str(coordinator), str(control), manifest.uri,
                               str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert [d.wait(timeout=30) for d in daemons] == [0, 0]
    ranks = {r: [json.loads(x) for x in (tmp_path / f"rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    assert all(s["world"] == 2 for r in ranks for s in ranks[r])
    for epoch in (0, 1):
        streams = [[s for s in ranks[r] if s["epoch"] == epoch] for r in (0, 1)]
        assert len(streams[0]) == len(streams[1]) > 0
        assert sorted(i for stream in streams for s in stream for i in s["ids"]) == list(range(manifest.num_samples))
