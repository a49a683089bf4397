"""stoker/pipeline/store/wheels.py: the cache's place, and a wheel fetched once then found there."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stoker.pipeline.store import wheels
from stoker.pipeline.store.wheels import WheelSource, cache_dir, fetch_wheel

SOURCE = WheelSource("tiny-pkg==1.0", "tiny_pkg-")


def test_the_cache_is_stoker_cache_else_under_home(monkeypatch, tmp_path):
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("STOKER_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "stoker"


def _pip(monkeypatch, returncode: int, writes: str | None = None) -> list[list[str]]:
    """A stand-in for `pip download` that writes `writes` into --dest; returns the commands it got."""
    calls: list[list[str]] = []

    def run(cmd, **_):
        calls.append(cmd)
        if writes:
            (Path(cmd[cmd.index("--dest") + 1]) / writes).write_bytes(b"zip")
        return subprocess.CompletedProcess(cmd, returncode, "", "ERROR: no such package")

    monkeypatch.setattr(wheels.subprocess, "run", run)
    return calls


def test_a_wheel_is_downloaded_once_and_then_found(monkeypatch, tmp_path):
    calls = _pip(monkeypatch, 0, writes="tiny_pkg-1.0-py3-none-any.whl")
    first = fetch_wheel(SOURCE, tmp_path)
    assert first == tmp_path / "tiny_pkg-1.0-py3-none-any.whl"
    assert fetch_wheel(SOURCE, tmp_path) == first and len(calls) == 1  # the second came from the cache
    assert calls[0][-1] == "tiny-pkg==1.0" and "--no-deps" in calls[0]


def test_a_failed_download_says_what_was_run_and_why(monkeypatch, tmp_path):
    _pip(monkeypatch, 1)
    with pytest.raises(RuntimeError, match=r"could not fetch tiny-pkg==1.0 \(.*pip download.*\):\nERROR: no such"):
        fetch_wheel(SOURCE, tmp_path)
