"""JAX programs fed by Stoker (run in processes of their own: JAX's threads do not mix with a
test process that forks).

    python tests/jax_script.py PROCESS_ID PROCESSES COORDINATOR_PORT CONTROL_PORT MANIFEST OUT
    python tests/jax_script.py one CONTROL_PORT MANIFEST OUT

The first is a multi-process job: each process initialises jax.distributed (the coordinator on
loopback), makes a Loader with format="jax" and no rank or world size, and appends each step's
sample ids to OUT/rank-R.jsonl. The second is one process: every step's sample ids and the
sha256 of its image array, as a jax.Array turned back into bytes, to OUT/one.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from stoker import ConsumerConfig, JobConfig, Loader


def one(control: str, manifest: str, out: str) -> None:
    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{control}", metrics_port=None)
    job = JobConfig(manifest_uri=manifest, batch_size=16, image_size=32, seed=3)
    with Loader(job, config=config, format="jax", rank=0, world_size=1) as loader, \
            open(Path(out) / "one.jsonl", "w") as record:
        for batch in loader:
            image = batch["image"]
            assert isinstance(image, jax.Array), type(image)
            digest = hashlib.sha256(jax.device_get(image).tobytes()).hexdigest()
            record.write(json.dumps({"ids": batch.sample_ids.tolist(), "sha256": digest}) + "\n")


def main() -> None:
    if sys.argv[1] == "one":
        one(*sys.argv[2:])
        return
    process_id, processes, coordinator, control, manifest, out = sys.argv[1:]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{coordinator}", num_processes=int(processes),
                               process_id=int(process_id))
    config = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind=f"tcp://127.0.0.1:{control}", metrics_port=0)
    job = JobConfig(manifest_uri=manifest, epochs=2, batch_size=8, image_size=32)
    with Loader(job, config=config, format="jax") as loader:
        record = open(Path(out) / f"rank-{loader.rank}.jsonl", "w", buffering=1)
        while loader.epoch < loader.epochs:
            for batch in loader:
                image = batch["image"]
                assert isinstance(image, jax.Array) and image.dtype == jnp.uint8 and image.shape[1:] == (32, 32, 3)
                mean = float(jnp.mean(image.astype(jnp.float32)))  # a computation on the device array
                record.write(json.dumps({"epoch": batch.epoch, "step": batch.step, "ids": batch.sample_ids.tolist(),
                                         "world": loader.world_size, "mean": mean}) + "\n")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
