"""stoker/protos/private_files.py: a credential is read only from a file no other user could have made or read."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from stoker.protos.private_files import PrivateFileError, check_private_dir, private_dir, read_private, write_private


def test_a_written_file_is_owner_only_and_reads_back(tmp_path):
    path = tmp_path / "run" / "job.key"
    write_private(path, "s3cret")
    write_private(path, "s3cret-2")  # replaced whole
    assert read_private(path) == "s3cret-2"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["job.key"]  # no partial file left beside it


def test_a_missing_file_is_none(tmp_path):
    assert read_private(tmp_path / "absent") is None


def test_a_file_others_can_read_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "job.key"
    path.write_text("s3cret")
    path.chmod(0o644)
    with pytest.raises(PrivateFileError, match=r"has mode 0644, not 0600.*\(chmod 600 it\)"):
        read_private(path)


def test_a_link_or_a_pipe_is_refused(tmp_path):
    target = tmp_path / "real"
    write_private(target, "s3cret")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(PrivateFileError, match="is a symbolic link"):
        read_private(tmp_path / "link")
    os.mkfifo(tmp_path / "pipe", 0o600)  # opened without blocking, refused before a read could wait on it
    with pytest.raises(PrivateFileError, match=r"is not a regular file.*\(remove it\)"):
        read_private(tmp_path / "pipe")


def test_a_private_dir_must_be_a_real_owner_only_directory(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(PrivateFileError, match="has mode 0755, not 0700"):
        check_private_dir(open_dir)
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(PrivateFileError, match="is a symbolic link"):
        check_private_dir(tmp_path / "link")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    check_private_dir(closed)


def test_the_runtime_dir_is_used_when_private_else_a_folder_of_ours_in_tmp(tmp_path, monkeypatch):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert private_dir() == runtime
    runtime.chmod(0o755)  # not private: not used
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = private_dir()
    assert made == tmp_path / f"stoker-{os.geteuid()}" and stat.S_IMODE(made.stat().st_mode) == 0o700
    assert private_dir() == made  # found again, not refused
    made.chmod(0o777)
    with pytest.raises(PrivateFileError, match="has mode 0777"):
        private_dir()
