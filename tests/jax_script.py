"""A JAX multi-process job fed by Stoker: the rank comes from jax.distributed, not torchrun's variables.

    python tests/jax_script.py PROCESS_ID PROCESSES COORDINATOR_PORT CONTROL_PORT MANIFEST OUT

Each process initialises jax.distributed (the coordinator on loopback), makes a Loader with
format="jax" and no rank or world size, and appends each step's sample ids to OUT/rank-R.jsonl.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from stoker import ConsumerConfig, JobConfig, Loader


def main() -> None:
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
