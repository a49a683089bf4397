"""workers/worker_config.py: `stoker worker`'s options, and the STOKER_* variables that set them."""

from __future__ import annotations

import os
import socket

from stoker.configured import options_of
from stoker.settings import variable
from workers.worker_config import WorkerConfig

# STOKER_* names that mean something else already (README: environment variables)
TAKEN = {"STOKER_HOST": "this node's address (accel/ranks.py)", "STOKER_JOB_SECRET": "the job secret itself",
         "STOKER_SHARD_CACHE": "the cache folder", "STOKER_CACHE": "Stoker's download cache",
         "STOKER_LAB_DIR": "the lab's state", "STOKER_WORKER_ARGS": "the systemd unit's extra flags"}
# shared with the Loader, in the same meaning
SAME_MEANING = {"STOKER_KEYS", "STOKER_INSECURE", "STOKER_SHARD_CACHE_GB"}


def test_every_setting_has_its_own_variable_that_means_nothing_else():
    names = [variable(o) for o in options_of(WorkerConfig) if o.setting]
    assert len(names) == len(set(names)) and not set(names) & set(TAKEN)
    assert SAME_MEANING <= set(names)
    assert "STOKER_PROCS" in names and "STOKER_DISPATCHER" in names and "STOKER_PARENT_PID" not in names


def test_the_host_id_defaults_to_host_and_pid():
    assert WorkerConfig("tcp://h:1").resolved_host_id() == f"{socket.gethostname()}-{os.getpid()}"
    assert WorkerConfig("tcp://h:1", host_id="h7").resolved_host_id() == "h7"
