"""protos/job_secret.py: the job credential's file is replaced whole, never read half-made or missing."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from protos import job_secret


def test_a_new_secret_replaces_the_old_in_one_rename_while_ranks_read_it(tmp_path, monkeypatch):
    """Rank 0 of run after run writes a fresh secret where the ranks of the new run are already
    reading: every read gets a whole secret (the old one or a new one), never an error."""
    monkeypatch.delenv(job_secret.ENV, raising=False)
    path = tmp_path / "stoker-job-5561.secret"
    written = {job_secret.for_rank_zero(str(path), "tcp://127.0.0.1:5561")}
    errors: list[BaseException] = []
    seen: set[bytes] = set()
    done = threading.Event()

    def read_all_the_time() -> None:
        while not done.is_set():
            try:
                seen.add(job_secret.for_consumer(str(path)))
            except BaseException as exc:  # noqa: BLE001 - any failure is what this test looks for
                errors.append(exc)

    readers = [threading.Thread(target=read_all_the_time) for _ in range(3)]
    for reader in readers:
        reader.start()
    for _ in range(200):
        written.add(job_secret.write_new(path))
    done.set()
    for reader in readers:
        reader.join()
    assert errors == [] and seen <= written and len(written) == 201
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_a_consumer_without_a_secret_is_told_where_to_get_one(tmp_path, monkeypatch):
    monkeypatch.delenv(job_secret.ENV, raising=False)
    with pytest.raises(job_secret.JobSecretError, match="pass --job-secret FILE .* or set \\$STOKER_JOB_SECRET"):
        job_secret.for_consumer(str(tmp_path / "none"))
    monkeypatch.setenv(job_secret.ENV, "ef" * 32)
    assert job_secret.for_consumer(str(tmp_path / "none")) == ("ef" * 32).encode()
