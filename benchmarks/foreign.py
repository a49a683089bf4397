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

and, beside them, the crop statistics that bound the loop: the share of each image's area the
training crop keeps and the share of its pixels the crop decoder decodes (whole iMCU columns and
rows around the window), and the crop decoder alone (its Python call included, no resize).

Two sets: `foreign` (above) and `photos`: 2,000 camera photos of ImageNet's geometry made from
photographs that ship on PyPI (benchmarks.photo_set). Goals (issues "The ratio answer you can
trust", item 7, and "At the limits", item 1): the full path costs at most 10% more CPU per image
than the bare loop; the bare loop reaches 1.4x libjpeg-turbo's full decode.

    python -m benchmarks foreign [ROUNDS]
    python -m benchmarks photos [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks import photo_set
from benchmarks.opencv_samples import PACKAGE, SAMPLES, SHA256, VERSION, fetch_archive
from benchmarks.report import CoreWatch, header, write_results
from benchmarks.suite import WORK, build_tj_loop, json_of
from stoker.calibrate import _pinned, imagenet_rate
from stoker.machine import cpu_model
from stoker.pipeline.images import _jpegcrop
from stoker.pipeline.images.augment import TrainTransform, crop_window
from stoker.pipeline.seeds import sample_random
from stoker.pipeline.store.shards import Manifest

CLASSES = 4
FOLDER = WORK / "foreign"
TJ_IMAGES = 2_000  # decodes timed per libjpeg-turbo round
BARE_IMAGES = 3_000  # images timed per bare-loop round
RUN_IMAGES = 6_000  # for the full path (100 epochs of 62 images): long enough that the worker's start-up is noise
CALIBRATE_S = 4.0  # CPU-seconds per calibration
CORE = "0"
# slipstream (github.com/harvard-visionlab/slipstream), a live peer, publishes about 730-820 random-resized crops
# per second per thread from JPEG on an AMD EPYC 9454 (the figure issue "At the limits" quotes; not measured here).
SLIPSTREAM = "730-820 random-resized crops/s per thread from JPEG, AMD EPYC 9454 (published)"


def foreign_set() -> tuple[list[Path], str]:
    """(the original JPEG files, the manifest of their shards), made once under benchmarks/work/foreign."""
    raw, shards = FOLDER / "raw" / "train", FOLDER / "shards"
    if not (shards / "manifest.json").exists():
        with tarfile.open(fetch_archive()) as archive:
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


def full_path_rate(manifest: str, epochs: int) -> dict:
    """One `stoker run` with one worker process: its images per CPU-second of the whole worker."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "summary.json"
        subprocess.run([sys.executable, "-m", "stoker", "run", "--data", manifest, "--hosts", "1", "--procs", "1",
                        "--epochs", str(epochs), "--accel", "null", "--no-progress", "--json", str(out),
                        "--data-bind", "tcp://127.0.0.1:0", "--control-bind", "tcp://127.0.0.1:0",
                        "--metrics-port", "-1", "--worker-metrics-port", "-1"],
                       check=True, capture_output=True, timeout=900)
        summary = json.loads(out.read_text())
    return {"per_core_rate": summary["per_core_rate"], "rows": summary["rows"]}


def _set(name: str) -> tuple[list[Path], str, str]:
    """(files, manifest, what the set is) of a set this benchmark knows."""
    if name == "photos":
        files, manifest = photo_set.build()
        stats = photo_set.statistics_of(files)
        return files, manifest, (f"{stats['files']} camera photos re-encoded at ImageNet's geometry from "
                                 f"{stats['sources']} photographs on PyPI (benchmarks.photo_set; median "
                                 f"{stats['median_width']:.0f} x {stats['median_height']:.0f}, "
                                 f"{stats['median_kb']:.0f} KB)")
    files, manifest = foreign_set()
    return files, manifest, f"{PACKAGE} {VERSION} samples/data, {len(files)} JPEGs (SHA-256 of the archive " \
                            f"{SHA256[:12]}...)"


def crop_statistics(manifest: Manifest, images: int = BARE_IMAGES) -> dict:
    """On one pinned core, the training crops of the set's first epochs as the worker draws them: the
    mean share of each image's area the crop keeps, the mean share of its pixels the crop decoder
    returns (the window with its filter margin, widened to whole iMCU columns), and the crop decoder
    alone (header, crop draw and the C call; no resize) per CPU-second."""
    transform, seconds, done = TrainTransform(), 0.0, 0
    kept: list[float] = []
    decoded: list[float] = []
    readers = [manifest.open_shard(i) for i in range(len(manifest.shards))]
    with CoreWatch(int(CORE)) as watch:
        while done < images:
            for shard, reader in enumerate(readers):
                for row in range(len(reader)):
                    jpeg, restarts = reader.jpeg(row), reader.restarts(row)
                    started = time.process_time()
                    width, height = _jpegcrop.header(jpeg)[:2]
                    crop = transform.crop(width, height, sample_random(done // 10_000, shard, row))
                    w = crop_window(width, height, crop, transform.crop_size)
                    _, region_w, region_h, *_ = _jpegcrop.decode(jpeg, w.denom, w.left, w.top, w.right, w.bottom, 1,
                                                                 restarts, strict=True)
                    seconds += time.process_time() - started
                    kept.append(crop.width * crop.height / (width * height))
                    decoded.append(region_w * region_h * w.denom ** 2 / (width * height))
                    done += 1
    return {"crop_area_kept": statistics.mean(kept), "pixels_decoded": statistics.mean(decoded),
            "decode_only": done / seconds, **watch.as_dict()}


def main(rounds: int = 3, set_name: str = "foreign") -> dict:
    files, manifest, described = _set(set_name)
    listing = WORK / f"{set_name}-files.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    tj = build_tj_loop()
    loaded = Manifest.load(manifest)
    found: dict[str, list[float]] = {k: [] for k in ("libjpeg_turbo_full", "bare_loop", "full_path",
                                                     "calibrate_no_wire", "calibrate_curve")}
    crops = _pinned(lambda: crop_statistics(loaded))
    for _ in range(rounds):  # interleaved, so drift on the host touches every contender alike
        found["libjpeg_turbo_full"].append(json_of(["taskset", "-c", CORE, tj, "full", str(listing), str(TJ_IMAGES)],
                                                   "images_per_s"))
        found["bare_loop"].append(json_of(["taskset", "-c", CORE, sys.executable, "-m", "benchmarks.bare_loop",
                                           "--manifest", manifest, "--images", str(BARE_IMAGES)], "images_per_s"))
        found["full_path"].append(full_path_rate(manifest, -(-RUN_IMAGES // len(files)))["per_core_rate"])
        found["calibrate_no_wire"].append(_pinned(lambda: imagenet_rate(loaded, CALIBRATE_S, wire=False)))
        found["calibrate_curve"].append(_pinned(lambda: imagenet_rate(loaded, CALIBRATE_S, wire=True)))
        print({k: round(v[-1]) for k, v in found.items()}, flush=True)
    medians = {k: statistics.median(v) for k, v in found.items()}
    name = "foreign" if set_name == "foreign" else f"foreign_{set_name}"
    result = {**header(name, "pillow-simd"), "set_name": set_name, "set": described, "sha256": SHA256,
              "rounds": rounds, "rates": found, "medians": medians, "crops": crops, "threads": 1,
              "cpu_model": cpu_model(),
              "bare_over_libjpeg_turbo": medians["bare_loop"] / medians["libjpeg_turbo_full"],
              "full_path_cost_over_bare": medians["bare_loop"] / medians["full_path"],
              "curve_cost_over_no_wire": medians["calibrate_no_wire"] / medians["calibrate_curve"]}
    write_results(name, result, markdown(result))
    _into_docs(markdown(result), "foreign" if set_name == "foreign" else f"foreign-{set_name}")
    print(markdown(result))
    return result


def _into_docs(table: str, marker: str) -> None:
    """The table between the set's markers in docs/measurements.md."""
    page = Path(__file__).parent.parent / "docs" / "measurements.md"
    text = page.read_text()
    begin, end = f"<!-- {marker}:begin -->\n", f"<!-- {marker}:end -->"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        page.write_text(head + begin + table + rest[rest.index(end):])


def markdown(r: dict) -> str:
    m, c = r["medians"], r.get("crops", {})
    v = ", ".join(f"{k} {x}" for k, x in r["versions"].items())
    command = "foreign" if r.get("set_name", "foreign") == "foreign" else r["set_name"]
    lines = [
        f"Made by `python -m benchmarks {command} {r['rounds']}` on {r['when']}, {r['machine']} ({r['cpu']}); {v}. "
        f"The set: {r['set']}. One thread pinned to one core; rates are images per CPU-second of the process that "
        f"did the work, medians of {r['rounds']} interleaved rounds.", "",
        "| contender | images per CPU-second |", "|---|---:|",
        f"| libjpeg-turbo in C, every pixel of the original files | {m['libjpeg_turbo_full']:,.0f} |"]
    if c:
        lines.append(f"| the crop decoder alone: header, crop draw, crop-window decode (no resize) | "
                     f"{c['decode_only']:,.0f} |")
    lines += [
        f"| the bare loop: read + crop-window decode + augment + batch, no sockets | {m['bare_loop']:,.0f} |",
        "| the full path: `stoker run --hosts 1 --procs 1 --accel null`, the worker's whole CPU | "
        f"{m['full_path']:,.0f} |",
        f"| `stoker calibrate`'s loop, batches not sent | {m['calibrate_no_wire']:,.0f} |",
        f"| `stoker calibrate`'s loop, each batch framed and sent over CURVE | {m['calibrate_curve']:,.0f} |", "",
        "| ratio | value | goal |", "|---|---:|---|",
        f"| bare loop / libjpeg-turbo full decode | {r['bare_over_libjpeg_turbo']:.2f}x | at least 1.4x |",
        f"| full path's CPU per image / bare loop's | {r['full_path_cost_over_bare']:.3f} | at most 1.10 |",
        f"| CPU per image with CURVE / without the wire (calibration) | {r['curve_cost_over_no_wire']:.3f} | "
        "(encryption between hosts; loopback runs do not pay it) |"]
    if c:
        full = m["libjpeg_turbo_full"]
        lines += [
            f"| the crop decoder alone / libjpeg-turbo full decode | {c['decode_only'] / full:.2f}x | "
            "(the loop's ceiling if resizing, mirroring and batching were free) |",
            f"| the training crop keeps, mean share of the image's area | {c['crop_area_kept']:.3f} | "
            f"(a decode that cost only the kept pixels: {1 / c['crop_area_kept']:.2f}x) |",
            f"| pixels the crop decoder returns, mean share (the window, its filter margin, whole iMCU columns) | "
            f"{c['pixels_decoded']:.3f} | (the same at this decoder's granularity: "
            f"{1 / c['pixels_decoded']:.2f}x) |",
            f"| per core, this CPU ({r.get('cpu_model', r['cpu'])}), one thread: the full path | "
            f"{m['full_path']:,.0f} images/s | slipstream: {SLIPSTREAM} |"]
    return "\n".join(lines + [""])


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3, sys.argv[2] if len(sys.argv) > 2 else "foreign")
