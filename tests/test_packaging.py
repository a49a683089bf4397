"""The repository, the sdist and the wheel have one shape: every file of the package is at the same path
under stoker/ in all three, nothing is installed beside it, and a wheel built from the sdist (what pip does
with a source release) holds every module. An sdist once carried the rooms twice (real files under
stoker/ plus a stray top-level pipeline/ with the C files again); a folder missing from the package list
once left `--accel torch` without its models."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from tests.rooms import ROOMS, ROOT

BUILD = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def _build(kind: str, source: Path, out: Path) -> Path:
    """setuptools' own PEP 517 hook, as pip calls it: the path of the sdist or wheel it wrote."""
    done = subprocess.run([sys.executable, "-c", BUILD, f"build_{kind}", str(out)], cwd=source, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def _repository_files() -> set[str]:
    listed = subprocess.run(["git", "ls-files", "stoker"], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(listed.stdout.split())


def test_the_sdist_and_a_wheel_built_from_it_have_the_repositorys_shape(tmp_path):
    sdist = _build("sdist", ROOT, tmp_path)
    with tarfile.open(sdist) as tar:
        top = sdist.name.removesuffix(".tar.gz")
        in_sdist = {m.name.removeprefix(f"{top}/") for m in tar.getmembers() if m.isfile()}
        tar.extractall(tmp_path / "src", filter="data")
    shipped = {name for name in in_sdist if name.startswith("stoker/")}
    assert shipped == _repository_files(), "the sdist's stoker/ differs from the repository's"
    beside = {name.split("/")[0] for name in in_sdist} - {"stoker", "stoker.egg-info"}
    assert beside <= {"PKG-INFO", "README.md", "pyproject.toml", "setup.cfg", "MANIFEST.in"}, beside

    wheel = _build("wheel", tmp_path / "src" / top, tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {name.split("/")[0] for name in names} == {"stoker", "-".join(wheel.name.split("-")[:2]) + ".dist-info"}
    assert any(name.startswith("stoker/pipeline/images/_jpegcrop") for name in names), \
        "the C files did not reach the build"
    modules = {name for name in _repository_files() if name.endswith((".py", ".pyi", ".proto", "py.typed"))}
    assert modules - names == set(), "the wheel built from the sdist lacks these"
    assert all(f"stoker/{room.replace('.', '/')}/__init__.py" in names for room in ROOMS)
