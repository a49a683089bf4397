"""stoker/workers/worker_config.py: `stoker worker`'s options, and the STOKER_* variables that set them."""

from __future__ import annotations

import os
import socket

from stoker.configured import options_of
from stoker.settings import variable
from stoker.workers.worker_config import WorkerConfig

# STOKER_* names that mean something else already (README: environment variables)
TAKEN = {"STOKER_HOST": "this node's address (stoker/accel/ranks.py)", "STOKER_JOB_SECRET": "the job secret itself",
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


def test_a_host_id_is_short_and_plain_at_parse_time_and_by_default(monkeypatch, capsys):
    """A host id is in every worker id, log line and metric label: one over 200 characters (the
    dispatcher's names stop at 256) or with a newline (a forged log line) is refused when parsed;
    a host name the default is made of loses what a host id may not hold."""
    import pytest

    from stoker.cli import main

    for bad in ("a\nb", "x" * 201, "two words", "a/b", ""):
        with pytest.raises(SystemExit) as exited:
            main(["worker", "--dispatcher", "tcp://127.0.0.1:1", "--host-id", bad])
        assert exited.value.code == 2 and "argument --host-id: must be 1 to 200" in capsys.readouterr().err
    monkeypatch.setattr(socket, "gethostname", lambda: "odd host\n" + "y" * 300)
    made = WorkerConfig("tcp://h:1").resolved_host_id()
    assert made.startswith("odd_host_yyy") and made.endswith(f"-{os.getpid()}") and len(made) == 200
