"""The environment is the locked one: `make setup` installs requirements.lock, and the lock covers
every dependency pyproject.toml names (a dependency added without `make lock` fails here)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
PILLOW_IS_REPLACED = {"pillow"}  # matplotlib asks for it; make setup removes it so that pillow-simd is PIL


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)", (ROOT / "requirements.lock").read_text(), re.M)
    return {_norm(name): version for name, version in pins}


def test_every_dependency_of_pyproject_is_in_the_lock():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    names = {_norm(re.split(r"[\[<>=!~; ]", d, maxsplit=1)[0]) for d in wanted}
    missing = names - set(_locked())
    assert not missing, f"not in requirements.lock (run `make lock`): {sorted(missing)}"


def test_the_installed_versions_are_the_locked_ones():
    differ = {}
    for name, version in _locked().items():
        if name in PILLOW_IS_REPLACED:
            continue
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            differ[name] = (version, "not installed")
            continue
        if installed != version:
            differ[name] = (version, installed)
    assert not differ, f"installed versions differ from requirements.lock (run `make setup`): {differ}"
