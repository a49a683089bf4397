"""The figure made smaller, on JPEGs the project never generated: the worker's full path against its
bare decode loop, and the bare loop against libjpeg-turbo's full decode, all in CPU time on one core.

The set is the 61 JPEG photographs and pictures OpenCV ships as sample data (calibration boards,
scenes, portraits, paintings; 7 KB to 325 KB, grey and colour, baseline and progressive), taken from
the opencv-python 4.10.0.84 source archive on PyPI and checked against its published SHA-256.
`stoker prepare imagenet` turns them into shards (in 4 classes) as a user's own folder would be.

Each round, on one pinned core and timed in CPU seconds of the process that did the work:
- libjpeg-turbo in C decoding every pixel of the original files (benchmarks/tj_loop.c);
- the bare loop (benchmarks.bare_loop): the worker's own read + crop-window decode + augment +
  batch code, no sockets;
- the full path: `stoker run --hosts 1 --procs 1 --accel null`, whose worker reads, decodes,
  augments, frames and sends every batch to the consumer; its figure is the worker's whole CPU
  (leasing, credit, the zmq I/O thread included) per image;
- the calibration with and without the wire (`stoker calibrate`'s own code): what framing and
  CURVE encryption add, which a loopback `stoker run` does not pay.

Goals (issue "The ratio answer you can trust", item 7): the full path costs at most 10% more CPU
per image than the bare loop; the bare loop reaches 1.4x libjpeg-turbo's full decode.

    python -m benchmarks foreign [ROUNDS]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.report import header, write_results
from benchmarks.suite import WORK, build_tj_loop, json_of
from stoker.calibrate import _pinned, imagenet_rate
from stoker.pipeline.store.shards import Manifest

PACKAGE, VERSION = "opencv-python", "4.10.0.84"
ARCHIVE = f"{PACKAGE}-{VERSION}.tar.gz"
SHA256 = "72d234e4582e9658ffea8e9cae5b63d488ad06994ef12d81dc303b17472f3526"
INDEX = f"https://pypi.org/simple/{PACKAGE}/"
SAMPLES = re.compile(r"^[^/]+/opencv/samples/data/[^/]+\.jpe?g$", re.IGNORECASE)
CLASSES = 4
FOLDER = WORK / "foreign"
TJ_IMAGES = 2_000  # decodes timed per libjpeg-turbo round
BARE_IMAGES = 3_000  # images timed per bare-loop round
RUN_EPOCHS = 100  # of 62 images, for the full path: long enough that the worker's start-up is noise
CALIBRATE_S = 4.0  # CPU-seconds per calibration
CORE = "0"


def _archive() -> Path:
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


def foreign_set() -> tuple[list[Path], str]:
    """(the original JPEG files, the manifest of their shards), made once under benchmarks/work/foreign."""
    raw, shards = FOLDER / "raw" / "train", FOLDER / "shards"
    if not (shards / "manifest.json").exists():
        with tarfile.open(_archive()) as archive:
            members = sorted((m for m in archive.getmembers() if m.isfile() and SAMPLES.match(m.name)),
                             key=lambda m: m.name)
            for index, member in enumerate(members):
                target = raw / f"n{index % CLASSES:08d}" / (Path(member.name).stem + ".JPEG")
                target.parent.mkdir(parents=True, exist_ok=True)
                source = archive.extractfile(member)
                assert source is not None
                target.write_bytes(source.read())
        subprocess.run([sys.executable, "-m", "stoker", "prepare", "imagenet", str(raw.parent), str(shards)],
                       check=True, capture_output=True)
    return sorted(raw.glob("*/*.JPEG")), str(shards / "manifest.json")


def full_path_rate(manifest: str) -> dict:
    """One `stoker run` with one worker process: its images per CPU-second of the whole worker."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "summary.json"
        subprocess.run([sys.executable, "-m", "stoker", "run", "--data", manifest, "--hosts", "1", "--procs", "1",
                        "--epochs", str(RUN_EPOCHS), "--accel", "null", "--no-progress", "--json", str(out),
                        "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                        "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                       check=True, capture_output=True, timeout=900)
        summary = json.loads(out.read_text())
    return {"per_core_rate": summary["per_core_rate"], "rows": summary["rows"]}


def main(rounds: int = 3) -> dict:
    files, manifest = foreign_set()
    listing = WORK / "foreign-files.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    tj = build_tj_loop()
    loaded = Manifest.load(manifest)
    found: dict[str, list[float]] = {k: [] for k in ("libjpeg_turbo_full", "bare_loop", "full_path",
                                                     "calibrate_no_wire", "calibrate_curve")}
    for _ in range(rounds):  # interleaved, so drift on the host touches every contender alike
        found["libjpeg_turbo_full"].append(json_of(["taskset", "-c", CORE, tj, "full", str(listing), str(TJ_IMAGES)],
                                                   "images_per_s"))
        found["bare_loop"].append(json_of(["taskset", "-c", CORE, sys.executable, "-m", "benchmarks.bare_loop",
                                           "--manifest", manifest, "--images", str(BARE_IMAGES)], "images_per_s"))
        found["full_path"].append(full_path_rate(manifest)["per_core_rate"])
        found["calibrate_no_wire"].append(_pinned(lambda: imagenet_rate(loaded, CALIBRATE_S, wire=False)))
        found["calibrate_curve"].append(_pinned(lambda: imagenet_rate(loaded, CALIBRATE_S, wire=True)))
        print({k: round(v[-1]) for k, v in found.items()}, flush=True)
    medians = {k: statistics.median(v) for k, v in found.items()}
    result = {**header("foreign", "pillow-simd"), "set": f"{PACKAGE} {VERSION} samples/data, {len(files)} JPEGs",
              "sha256": SHA256, "rounds": rounds, "rates": found, "medians": medians,
              "bare_over_libjpeg_turbo": medians["bare_loop"] / medians["libjpeg_turbo_full"],
              "full_path_cost_over_bare": medians["bare_loop"] / medians["full_path"],
              "curve_cost_over_no_wire": medians["calibrate_no_wire"] / medians["calibrate_curve"]}
    write_results("foreign", result, markdown(result))
    _into_docs(markdown(result))
    print(markdown(result))
    return result


def _into_docs(table: str) -> None:
    """The table between the foreign markers in docs/measurements.md."""
    page = Path(__file__).parent.parent / "docs" / "measurements.md"
    text = page.read_text()
    begin, end = "<!-- foreign:begin -->\n", "<!-- foreign:end -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        page.write_text(head + begin + table + rest[rest.index(end):])


def markdown(r: dict) -> str:
    m = r["medians"]
    v = ", ".join(f"{k} {x}" for k, x in r["versions"].items())
    return "\n".join([
        f"Made by `python -m benchmarks foreign {r['rounds']}` on {r['when']}, {r['machine']} ({r['cpu']}); {v}. "
        f"The set: {r['set']} (SHA-256 of the archive {r['sha256'][:12]}...). One pinned core; rates are images per "
        f"CPU-second of the process that did the work, medians of {r['rounds']} interleaved rounds.", "",
        "| contender | images per CPU-second |", "|---|---:|",
        f"| libjpeg-turbo in C, every pixel of the original files | {m['libjpeg_turbo_full']:,.0f} |",
        f"| the bare loop: read + crop-window decode + augment + batch, no sockets | {m['bare_loop']:,.0f} |",
        "| the full path: `stoker run --hosts 1 --procs 1 --accel null`, the worker's whole CPU | "
        f"{m['full_path']:,.0f} |",
        f"| `stoker calibrate`'s loop, batches not sent | {m['calibrate_no_wire']:,.0f} |",
        f"| `stoker calibrate`'s loop, each batch framed and sent over CURVE | {m['calibrate_curve']:,.0f} |", "",
        "| ratio | value | goal |", "|---|---:|---|",
        f"| bare loop / libjpeg-turbo full decode | {r['bare_over_libjpeg_turbo']:.2f}x | at least 1.4x |",
        f"| full path's CPU per image / bare loop's | {r['full_path_cost_over_bare']:.3f} | at most 1.10 |",
        f"| CPU per image with CURVE / without the wire (calibration) | {r['curve_cost_over_no_wire']:.3f} | "
        "(encryption between hosts; loopback runs do not pay it) |", ""])


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
