"""pipeline/files.py: a file is replaced whole or not at all."""

from __future__ import annotations

import os

import pytest

from stoker.pipeline.files import write_atomically


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
