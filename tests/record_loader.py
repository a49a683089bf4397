"""Run a user's training script unchanged, recording what each rank's Loader yields.

    torchrun ... tests/record_loader.py RECORD_DIR SCRIPT [SCRIPT ARGS...]

Every batch a `stoker.Loader` yields is appended to RECORD_DIR/rank-R.jsonl (epoch, step, rows,
sample ids, time, world size, torchrun's restart count) before the script sees it, so a test can
check exactly-once delivery and equal steps of a script it did not write (the README's example)
without touching its code.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

from stoker.loader import Loader


def main() -> None:
    record_dir, script, *script_args = sys.argv[1:]
    iterate = Loader.__iter__
    files: dict[int, object] = {}

    def recorded(loader: Loader):
        out = files.get(loader.rank)
        if out is None:
            out = files[loader.rank] = open(Path(record_dir) / f"rank-{loader.rank}.jsonl", "a", buffering=1)
        for batch in iterate(loader):
            out.write(json.dumps({"epoch": batch.epoch, "step": batch.step, "rows": batch.rows,
                                  "ids": batch.sample_ids.tolist(), "at": time.time(), "world": loader.world_size,
                                  "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))}) + "\n")
            yield batch

    Loader.__iter__ = recorded
    sys.argv = [script, *script_args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
