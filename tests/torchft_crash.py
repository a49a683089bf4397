"""Run a torchft training script that SIGKILLs itself inside its `n`-th step, as its gradients are handed to the
all-reduce (torchft's `Manager.allreduce`): a replica group killed mid-step, whose step no group can commit (the
others' all-reduce fails, their should_commit() is false, and their batches come again).

    python -m tests.torchft_crash N SCRIPT [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from torchft import Manager


def _dies_at(n: int) -> None:
    original = Manager.allreduce
    calls = 0

    def allreduce(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == n:
            print(f"killed inside step {n}, at its all-reduce", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, *args, **kwargs)

    Manager.allreduce = allreduce  # type: ignore[method-assign]


if __name__ == "__main__":
    _dies_at(int(sys.argv[1]))
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
