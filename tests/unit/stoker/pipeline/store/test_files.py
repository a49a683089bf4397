"""stoker/pipeline/store/files.py: a file is replaced whole or not at all, and a refused write says which file and
what to do."""

from __future__ import annotations

import errno
import os

import pytest

from stoker.pipeline.store.files import replace_atomically, write_atomically
from stoker.protos.errors import ResourceError


def test_the_new_text_replaces_the_old_and_nothing_is_left_beside_it(tmp_path):
    path = tmp_path / "state.json"
    write_atomically(path, "one")
    write_atomically(str(path), "two")
    assert path.read_text() == "two" and [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_a_write_that_fails_leaves_the_old_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    write_atomically(path, "old")

    def crash(fd: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", crash)  # dies after writing the new text, before the rename
    with pytest.raises(OSError, match="disk gone"):
        write_atomically(path, "new")
    assert path.read_text() == "old"


def test_a_full_disk_is_one_line_naming_the_file_and_what_to_do_and_the_old_file_stays(full_disk):
    """It used to say "[Errno 28] No space left on device" alone, and leave the half-written .tmp."""
    folder, fill = full_disk
    path = folder / "state.json"
    write_atomically(path, "old")
    fill()
    with pytest.raises(ResourceError) as refused:
        write_atomically(path, "new" * 10_000, "checkpoint", "pass --checkpoint elsewhere")
    assert str(refused.value) == (f"cannot write checkpoint {path}: no space left on device (free space there or "
                                  f"pass --checkpoint elsewhere)")
    assert refused.value.errno == errno.ENOSPC and "\n" not in str(refused.value)
    assert path.read_text() == "old" and sorted(p.name for p in folder.iterdir()) == ["filler", "state.json"]


def test_a_refused_write_of_any_writer_removes_what_it_wrote(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    path.write_bytes(b"old")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(ResourceError, match=rf"^cannot write model {path}: no space left on device \(free space "
                                            rf"there or write it elsewhere\)$"):
        replace_atomically(path, lambda f: f.write(b"new"), "model")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_a_read_only_folder_says_so(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path / "s.json.tmp"))

    monkeypatch.setattr("builtins.open", read_only)
    with pytest.raises(ResourceError, match=r": read-only file system \(make its folder writable or write it "):
        write_atomically(tmp_path / "s.json", "x")
