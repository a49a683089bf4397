"""OpenCV's sample data from the opencv-python source archive on PyPI, fetched once and checked against its
published SHA-256: the photographs two benchmarks take (benchmarks.foreign, benchmarks.photo_set)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.suite import WORK

PACKAGE, VERSION = "opencv-python", "4.10.0.84"
ARCHIVE = f"{PACKAGE}-{VERSION}.tar.gz"
SHA256 = "72d234e4582e9658ffea8e9cae5b63d488ad06994ef12d81dc303b17472f3526"
INDEX = f"https://pypi.org/simple/{PACKAGE}/"
SAMPLES = re.compile(r"^[^/]+/opencv/samples/data/[^/]+\.jpe?g$", re.IGNORECASE)


def fetch_archive() -> Path:
    """The source archive, fetched once from PyPI's simple index and checked against SHA256."""
    path = WORK / ARCHIVE
    if not path.exists():
        WORK.mkdir(exist_ok=True)
        with urllib.request.urlopen(INDEX, timeout=60) as page:
            links = re.findall(r'href="([^"]+)"', page.read().decode())
        url = next((link.split("#")[0] for link in links if link.split("#")[0].endswith("/" + ARCHIVE)), None)
        if url is None:
            raise RuntimeError(f"{INDEX} lists no {ARCHIVE}")
        with urllib.request.urlopen(url, timeout=600) as response, tempfile.NamedTemporaryFile(dir=WORK,
                                                                                          delete=False) as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
        os.replace(out.name, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        path.unlink()
        raise RuntimeError(f"{ARCHIVE} has SHA-256 {digest}, not the published {SHA256}: removed, run again")
    return path
