"""The wheel installs every package of the source tree: a folder with an __init__.py that is not in
pyproject's package list would be missing from an install and fail only there (it once left
`--accel torch` without its models)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("pipeline", "protos", "workers", "accel")


def source_packages() -> set[str]:
    """Every package under stoker/ and the rooms, by the name it is installed under."""
    found = {"stoker"}
    for folder in ("stoker", *ROOMS):
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            found.add(".".join(parts if parts[0] == "stoker" else ("stoker", *parts)))
    return found


def test_every_package_of_the_source_tree_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert "stoker.accel.control" in source_packages()  # the walk reached the rooms' subpackages
    assert source_packages() - listed == set(), "add them to [tool.setuptools] packages in pyproject.toml"
    assert listed - source_packages() == set(), "listed, but no such package in the source tree"
