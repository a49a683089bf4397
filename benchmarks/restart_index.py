"""What the restart-marker index costs on disk and buys in decode time (issue 17, item 1).

On the default set's original files (what a user hands `stoker prepare imagenet`):

- size: the files as they are; transcoded with optimal Huffman tables and no markers (what
  `interval_px 0` writes, so the markers' own cost can be told apart from the table change);
  transcoded with a restart marker every 16, 32 and 64 pixels of a row, and each index;
- speed: the crop decoder (`pipeline.images._jpegcrop`, no resize) on every file's MLPerf training crop
  window, the plain file against the spliced intervals of each transcoded one, interleaved image
  by image on one pinned core, medians of `repeats` rounds;
- which files the transcoder kept as they were, and why.

The figures go to benchmarks/results/restart_index.{json,md}.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from pathlib import Path

from benchmarks.report import CoreWatch, header, write_results
from stoker.datasets import default_imagenet
from stoker.pipeline.images import _jpegcrop, _jpegrestart
from stoker.pipeline.images.augment import TrainTransform, crop_window
from stoker.pipeline.prepare import RESTART_INTERVAL_PX
from stoker.pipeline.seeds import sample_random

CORE = 0
INTERVALS_PX = (16, 32, 64)


def original_files() -> list[Path]:
    raw = default_imagenet().parent.parent / "raw" / "train"
    return sorted(raw.glob("*/*.JPEG"))


def main(repeats: int = 3) -> dict:
    os.sched_setaffinity(0, {CORE})
    transform, kept = TrainTransform(), Counter()
    sizes = Counter()
    samples = []  # (original, window, {interval: (jpeg, index)})
    for number, path in enumerate(original_files()):
        data = path.read_bytes()
        try:
            versions = {px: _jpegrestart.transcode(data, px) for px in (0, *INTERVALS_PX)}
        except (NotImplementedError, ValueError, RuntimeError) as exc:
            kept[str(exc)] += 1
            continue
        sizes["original"] += len(data)
        for px, (jpeg, index, _) in versions.items():
            sizes[f"jpeg {px}"] += len(jpeg)
            sizes[f"index {px}"] += len(index) if index else 0
        width, height = _jpegcrop.header(data)[:2]
        window = crop_window(width, height, transform.crop(width, height, sample_random(0, 0, number)), transform.size)
        samples.append((data, window, versions, "progressive" if versions[0][2] else "baseline"))
    rounds = []
    paths: Counter[str] = Counter()
    kinds = Counter(kind for *_, kind in samples)
    with CoreWatch(CORE) as watch:
        for _ in range(repeats):
            spent = Counter()
            for data, w, versions, kind in samples:
                args = (w.denom, w.left, w.top, w.right, w.bottom)
                started = time.perf_counter()
                _jpegcrop.decode(data, *args)
                seconds = time.perf_counter() - started
                spent["plain"] += seconds
                spent[f"plain, {kind} sources"] += seconds
                for px in INTERVALS_PX:
                    jpeg, index, _ = versions[px]
                    started = time.perf_counter()
                    out = _jpegcrop.decode(jpeg, *args, 1, index)
                    seconds = time.perf_counter() - started
                    spent[f"spliced {px}"] += seconds
                    if px == RESTART_INTERVAL_PX:
                        spent[f"spliced {px}, {kind} sources"] += seconds
                        paths[out[5]] += 1
            rounds.append({name: (kinds[name.split(", ")[1].split()[0]] if ", " in name else len(samples)) / seconds
                           for name, seconds in spent.items()})
    rates = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    original = sizes["original"]
    result = {**header("restart_index", "pillow-simd"), "images": len(samples), "sources": dict(kinds),
              "kept_as_is": dict(kept),
              "bytes": dict(sizes), "rounds": rounds, "images_per_s": rates,
              "speedup": {px: rates[f"spliced {px}"] / rates["plain"] for px in INTERVALS_PX},
              "size_vs_original": {px: (sizes[f"jpeg {px}"] + sizes[f"index {px}"]) / original for px in INTERVALS_PX},
              "marker_cost_vs_huffman_only": {px: sizes[f"jpeg {px}"] / sizes["jpeg 0"] - 1 for px in INTERVALS_PX},
              "index_vs_original": {px: sizes[f"index {px}"] / original for px in INTERVALS_PX},
              "default_interval_px": RESTART_INTERVAL_PX, "paths_at_default": dict(paths), **watch.as_dict()}
    write_results("restart_index", result, markdown(result))
    print(markdown(result))
    return result


def markdown(result: dict) -> str:
    b, n = result["bytes"], result["images"]
    lines = [f"{n} transcodable files of the default set, MLPerf training crop windows, crop decoder only (no "
             f"resize), core {CORE}, medians of {len(result['rounds'])} interleaved rounds; "
             f"kept as they were: {', '.join(f'{c} {why}' for why, c in result['kept_as_is'].items()) or 'none'}.",
             "", "| shards hold | bytes (JPEG + index) vs the original files | the markers' cost (vs Huffman-only) "
             "| the index (vs the originals) | crop decode images/s | vs plain |", "|---|---|---|---|---|---|",
             f"| the original files | 1.000 | — | — | {result['images_per_s']['plain']:,.0f} | 1.00x |",
             f"| transcoded, optimal Huffman tables, no markers | {b['jpeg 0'] / b['original']:.3f} | — | — | "
             "— | — |"]
    for px in INTERVALS_PX:
        default = " (default)" if px == result["default_interval_px"] else ""
        lines.append(f"| a restart marker every {px} px{default} | {result['size_vs_original'][px]:.3f} | "
                     f"{100 * result['marker_cost_vs_huffman_only'][px]:+.1f}% | "
                     f"{100 * result['index_vs_original'][px]:.1f}% | {result['images_per_s'][f'spliced {px}']:,.0f} "
                     f"| {result['speedup'][px]:.2f}x |")
    px, rates = result["default_interval_px"], result["images_per_s"]
    lines += ["", f"| at {px} px, by source file | files | plain images/s | spliced images/s | vs plain |",
              "|---|---|---|---|---|"]
    for kind, count in sorted(result["sources"].items()):
        plain, spliced = rates[f"plain, {kind} sources"], rates[f"spliced {px}, {kind} sources"]
        shown = f"{kind} (written sequential)" if kind == "progressive" else kind
        lines.append(f"| {shown} | {count} | {plain:,.0f} | {spliced:,.0f} | {spliced / plain:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
