"""The CPU:accelerator ratio finding, reproduced on this machine: both sweeps, then the plan.

    python -m benchmarks ratio     (root: the sweeps run on `stoker lab` namespaces and quotas)

Runs `stoker sweep` for ImageNet and Wikipedia against the scaled ipu-pod16 profile (each
resumable, results in benchmarks/results/sweeps/DATASET), then `stoker plan --compare
ipu-pod16,dgx-a100` with the per-core rates read from the sweeps' host-bound points, and
rewrites the block of docs/ratio.md between `<!-- ratio:begin -->` and `<!-- ratio:end -->`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from stoker.sweep import TIME_TO_TRAIN_PLOT, knee, load_points, per_core_rate

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "benchmarks" / "results" / "sweeps"
PICTURE = ROOT / "docs" / "time_to_train.png"  # the sweeps' side-by-side plot, kept with the page that shows it


def _stoker(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"stoker {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def main() -> None:
    seconds = {}
    for dataset in ("imagenet", "wikipedia"):
        started = time.perf_counter()
        _stoker("sweep", "--dataset", dataset, "--out", str(SWEEPS / dataset), "--no-progress")
        seconds[dataset] = time.perf_counter() - started
        print(f"sweep {dataset}: {seconds[dataset]:.0f} s", flush=True)
    plan = _stoker("plan", "--sweep", str(SWEEPS / "imagenet"), str(SWEEPS / "wikipedia"),
                   "--compare", "ipu-pod16,dgx-a100", "--json", str(SWEEPS / "plan.json"))
    shutil.copyfile(SWEEPS / TIME_TO_TRAIN_PLOT, PICTURE)
    points = {d: load_points(SWEEPS / d) for d in ("imagenet", "wikipedia")}
    knees = {d: knee(p) for d, p in points.items()}
    rates = {d: per_core_rate(p) for d, p in points.items()}
    lines = ["Made by `python -m benchmarks ratio` on this machine (2 cores; the sweeps run as root on",
             f"`stoker lab`; {time.strftime('%Y-%m-%d')}). The x axes undo the scale: host cores per full-size",
             "IPU-POD16.", ""]
    for dataset in ("imagenet", "wikipedia"):
        lines += [(SWEEPS / dataset / "sweep.md").read_text().strip(), "",
                  f"Its plot: `benchmarks/results/sweeps/{dataset}/sweep.png` (written by the sweep, not committed).",
                  ""]
    if all(knees.values()):
        ratio = knees["imagenet"].cores_per_system / knees["wikipedia"].cores_per_system
        lines += [f"Per unit of accelerator, ResNet-50's knee needs {ratio:,.0f}x the host CPU of BERT's "
                  f"({knees['imagenet'].cores_per_system:,.1f} against {knees['wikipedia'].cores_per_system:,.1f} "
                  f"cores per IPU-POD16), and the projected time-to-train falls until the knee and is flat after "
                  f"it. Per-core rates read from the host-bound points: {rates['imagenet']:,.0f} img/s and "
                  f"{rates['wikipedia']:,.0f} seq/s.", ""]
    lines += ["Both sweeps in one picture (`stoker sweep` writes it beside the sweep folders, "
              "`benchmarks/results/sweeps/time_to_train.png`): time-to-train of the full-size system against host "
              "cores per system, measured points and the model drawn from each sweep's per-core rate, the knee "
              "marked.", "", "![time-to-train against host cores per accelerator](time_to_train.png)", ""]
    lines += ["`stoker plan --sweep benchmarks/results/sweeps/imagenet benchmarks/results/sweeps/wikipedia "
              "--compare ipu-pod16,dgx-a100`:", "", "```", plan.strip(), "```"]
    page = ROOT / "docs" / "ratio.md"
    text = page.read_text()
    block = "<!-- ratio:begin -->\n" + "\n".join(lines) + "\n<!-- ratio:end -->"
    page.write_text(re.sub(r"<!-- ratio:begin -->.*?<!-- ratio:end -->", lambda _: block, text, flags=re.S))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
