"""stoker/protos/job_secret.py: the job credential's file is replaced whole, never read half-made or missing, and
never one another local user could have planted or read."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
import time

import pytest

from stoker.protos import job_secret


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


STRANGER = 65534  # nobody: another local uid


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("making a file of another uid needs root")


def _planted(path, mode: int = 0o644, uid: int = STRANGER) -> None:
    path.write_text("ab" * 32 + "\n")
    os.chmod(path, mode)
    os.chown(path, uid, uid)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A temp directory of the test's own, and no session runtime directory: the default path's home."""
    monkeypatch.delenv(job_secret.ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_secret_planted_by_another_user_is_refused_by_the_dispatcher_and_the_ranks(tmp_path, monkeypatch):
    _as_root()
    monkeypatch.delenv(job_secret.ENV, raising=False)
    path = tmp_path / "job.secret"
    _planted(path)
    for take in (job_secret.load_or_create, lambda p: job_secret.for_rank_zero(str(p), "tcp://127.0.0.1:5561"),
                 lambda p: job_secret.for_consumer(str(p), wait_s=5)):
        started = time.monotonic()
        with pytest.raises(job_secret.UntrustedSecret, match=f"belongs to uid {STRANGER}, not to you") as refused:
            take(path)
        assert "\n" not in str(refused.value) and time.monotonic() - started < 2  # refused at once, not waited on
    assert path.read_text() == "ab" * 32 + "\n" and path.stat().st_uid == STRANGER  # nor adopted or replaced


def test_our_own_secret_file_open_to_others_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(job_secret.ENV, raising=False)
    path = tmp_path / "job.secret"
    _planted(path, 0o644, os.geteuid())
    with pytest.raises(job_secret.UntrustedSecret, match="has mode 0644, not 0600.*chmod 600"):
        job_secret.load_or_create(path)
    os.chmod(path, 0o600)
    assert job_secret.load_or_create(path) == b"ab" * 32


def test_a_symbolic_link_at_the_secret_path_is_neither_read_nor_written_through(tmp_path, monkeypatch):
    monkeypatch.delenv(job_secret.ENV, raising=False)
    theirs = tmp_path / "theirs"
    theirs.write_text("cd" * 32 + "\n")
    path = tmp_path / "job.secret"
    path.symlink_to(theirs)
    with pytest.raises(job_secret.UntrustedSecret, match="symbolic link"):
        job_secret.for_consumer(str(path))
    with pytest.raises(job_secret.UntrustedSecret, match="symbolic link"):
        job_secret.load_or_create(path)
    secret = job_secret.write_new(path)  # rank 0 replacing an old job's: the link is replaced, not followed
    assert theirs.read_text() == "cd" * 32 + "\n" and not path.is_symlink()
    assert job_secret.read(path) == secret


def test_a_raced_temporary_name_cannot_capture_the_secret(private_tmp):
    """A stranger who made the names rank 0 might write through first (the old predictable
    `.NAME.PID`, open to all) gets nothing: the secret goes to a file of a random name made with
    O_EXCL, in a directory only we can enter."""
    _as_root()
    folder = private_tmp / f"stoker-{os.geteuid()}"
    folder.mkdir(mode=0o700)
    name = "stoker-job-5561.secret"
    traps = [folder / f".{name}.{os.getpid()}", private_tmp / f".{name}.{os.getpid()}", private_tmp / name]
    for trap in traps:
        trap.write_text("")
        os.chmod(trap, 0o666)
        os.chown(trap, STRANGER, STRANGER)
    secret = job_secret.for_rank_zero(None, "tcp://127.0.0.1:5561")
    assert all(trap.read_text() == "" for trap in traps)
    assert job_secret.default_path("tcp://127.0.0.1:5561") == folder / name
    assert job_secret.for_consumer(None, "tcp://127.0.0.1:5561") == secret
    st = (folder / name).stat()
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600


def test_the_default_secret_lives_in_a_private_directory_made_0700(private_tmp):
    path = job_secret.default_path("tcp://127.0.0.1:5561")
    assert path == private_tmp / f"stoker-{os.geteuid()}" / "stoker-job-5561.secret"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_the_session_runtime_directory_is_used_only_when_it_is_ours_and_0700(private_tmp, monkeypatch):
    runtime = private_tmp / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert job_secret.default_path("tcp://h:7000") == runtime / "stoker-job-7000.secret"
    os.chmod(runtime, 0o755)
    assert job_secret.default_path("tcp://h:7000").parent == private_tmp / f"stoker-{os.geteuid()}"


@pytest.mark.parametrize("spoil,problem", [
    (lambda d: os.chown(d, STRANGER, STRANGER), f"belongs to uid {STRANGER}, not to you"),
    (lambda d: os.chmod(d, 0o777), "has mode 0777, not 0700"),
    (lambda d: (d.rmdir(), d.symlink_to(d.parent)), "is a symbolic link"),
])
def test_a_private_directory_someone_else_could_enter_is_refused(private_tmp, spoil, problem):
    if "uid" in problem:
        _as_root()
    folder = private_tmp / f"stoker-{os.geteuid()}"
    folder.mkdir(mode=0o700)
    spoil(folder)
    for take in (lambda: job_secret.for_rank_zero(None, "tcp://127.0.0.1:5561"),
                 lambda: job_secret.for_consumer(None, "tcp://127.0.0.1:5561")):
        with pytest.raises(job_secret.UntrustedSecret, match=f"{folder} {problem}.*set \\$TMPDIR") as refused:
            take()
        assert "\n" not in str(refused.value)
    assert not (private_tmp / "stoker-job-5561.secret").exists()
