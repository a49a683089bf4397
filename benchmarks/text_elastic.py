"""Text jobs at another world size, run again and again at the default timeouts (issue 49's repeat table).

A real torchrun DDP job of a token set (tests/ddp_script.py --lm-seq-len: gloo, an all-reduce every step,
every stepped document id recorded) fed by long-lived `stoker worker` daemons at their defaults. Rank 0
saves the data position mid-epoch, every rank crashes a few steps later (no goodbye), and the script is
run again from the checkpoint at another world size while the daemons run on. Shapes:

- shrink: 3 ranks, then 2 (one source of 300 documents)
- grow: 2 ranks, then 4
- chain: 3 ranks, then 2 (which checkpoint and crash again in the same epoch), then 4 (a two-source mixture)
- node-lost-and-added: `torchrun --nnodes 1:2` in network namespaces, node1 added then killed
  (tests/integration/test_multinode.py::test_an_elastic_lm_job_grows_to_two_nodes_and_shrinks_back_with_every_document_once,
  run as it is; it checks every document once itself); its gap: the last step at one world size to the
  first at the next, torchrun's restart included

A run passes when every run of the job exits as planned and each epoch's planned documents are stepped once
across the runs (each run's steps before the checkpoint the next one loaded, and the last run whole), with
equal steps per rank in every run. Half the runs of each shape go beside two busy loops. Reported per shape:
passes, and the longest gap between two steps after a change of world size, from the relaunch to its first
step included (wall clock: what a change costs).

`python -m benchmarks text_elastic [RUNS]` (default 10 per shape); results: benchmarks/results/text_elastic.{json,md}.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import free_port
from benchmarks.report import header, write_results
from benchmarks.soak import _env, _finish, _Fleet
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from tests.token_corpus import prepared, two_sources

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "tests" / "ddp_script.py"
COMMON = ("--lm-seq-len", "64", "--batch-size", "4", "--epochs", "2")
RUN_TIMEOUT_S = 240.0
ELASTIC_TEST = ("tests/integration/test_multinode.py::"
                "test_an_elastic_lm_job_grows_to_two_nodes_and_shrinks_back_with_every_document_once")


@dataclass(frozen=True)
class Shape:
    name: str
    worlds: tuple[int, ...]  # the world size of each run, in turn
    save_at: tuple[int, ...]  # each run but the last: rank 0 saves after this many of its steps, then all crash
    mixture: bool = False


SHAPES = (Shape("shrink", (3, 2), (9,)), Shape("grow", (2, 4), (9,)), Shape("chain", (3, 2, 4), (9, 7), mixture=True))


def _torchrun(manifest: str, out: Path, port: int, ranks: int, *extra: str) -> subprocess.Popen:
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return subprocess.Popen([torchrun, "--nproc-per-node", str(ranks), "--master-port", str(free_port()), str(SCRIPT),
                             "--data", manifest, "--out", str(out), "--control-port", str(port), *COMMON, *extra],
                            env=_env(), stdout=open(out / "torchrun.log", "a"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _steps(out: Path, ranks: int, suffix: str) -> dict[int, list[dict]]:
    return {rank: [x for x in (json.loads(line) for line in (out / f"rank-{rank}{suffix}.jsonl").read_text()
                                .splitlines()) if "step" in x] for rank in range(ranks)}


def _planned(manifest: str) -> list[list[int]]:
    job = JobConfig(manifest_uri=manifest, dataset="tokens", epochs=2, batch_size=4, lm=LMConfig(64))
    plan = job.plan(Manifest.load(manifest))
    return [sorted(int(i) for u in plan.units(epoch) for i in u.sample_ids()) for epoch in range(2)]


def run_once(manifest: str, shape: Shape, busy: bool, logs: Path) -> dict:
    """One run of a shape: a crash at each world size but the last, each resumed at the next."""
    out = Path(tempfile.mkdtemp(prefix=f"text-elastic-{shape.name}-", dir=logs))
    port = free_port()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if busy else 0)]
    fleet = _Fleet(port, 2, out)
    kept: list[dict] = []
    gaps: list[float] = []
    try:
        for number, world in enumerate(shape.worlds):
            run_dir = out / f"run-{number}"
            run_dir.mkdir()
            extra = ["--resume"] if number else []
            if number:
                (run_dir / "state.json").write_text((out / f"run-{number - 1}" / "state.json").read_text())
            last = number == len(shape.worlds) - 1
            if not last:
                extra += ["--save-at", str(shape.save_at[number]), "--crash-after", str(shape.save_at[number] + 3)]
            launched = time.time()
            code = _finish(_torchrun(manifest, run_dir, port, world, *extra), run_dir, RUN_TIMEOUT_S)
            if (code != 0) if last else (code in (0, None)):
                return {"passed": False, "why": f"run {number} at {world} ranks exited {code}", "out": str(out)}
            steps = _steps(run_dir, world, "-resumed" if number else "")
            if number:
                times = [launched] + sorted(s["at"] for s in steps[0])
                gaps.append(max(b - a for a, b in zip(times, times[1:], strict=False)))
            if not last:
                state = json.loads((run_dir / "state.json").read_text())
                steps = {r: [s for s in st if (s["epoch"], s["step"]) < (state["epoch"], state["step"])]
                         for r, st in steps.items()}
            if len({len(st) for st in steps.values()}) != 1:
                return {"passed": False, "why": f"run {number}: unequal steps per rank", "out": str(out)}
            kept += [s for st in steps.values() for s in st]
        for epoch, want in enumerate(_planned(manifest)):
            got = sorted(i for s in kept if s["epoch"] == epoch for i in s["ids"])
            if got != want:
                return {"passed": False, "why": f"epoch {epoch}: {len(got)} documents stepped, {len(set(got))} "
                                                f"distinct, {len(want)} planned", "out": str(out)}
        return {"passed": True, "why": "", "longest_gap_s": round(max(gaps), 2), "out": str(out)}
    finally:
        fleet.stop()
        for loop in loops:
            loop.kill()
            loop.wait()


def elastic_once(busy: bool, logs: Path) -> dict:
    """The torchrun elastic test in network namespaces, once (it checks its documents itself); the longest
    gap after a change of world size, from the records it leaves: the last step of a round to the first of
    the next, torchrun's restart included."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if busy else 0)]
    base = Path(tempfile.mkdtemp(prefix="text-elastic-nodes-", dir=logs))
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                               str(base), ELASTIC_TEST], cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    tail = done.stdout.strip().splitlines()[-1:] or [""]
    outcome = {"passed": done.returncode == 0 and "1 passed" in tail[0], "why": tail[0], "out": str(base)}
    records = sorted((json.loads(line) for f in base.glob("*/rank-*.jsonl") for line in f.read_text().splitlines()),
                     key=lambda x: x["at"])
    changes = [b["at"] - a["at"] for a, b in zip(records, records[1:], strict=False) if a["world"] != b["world"]]
    return outcome | ({"longest_gap_s": round(max(changes), 2)} if changes else {})


def make_data(folder: Path) -> dict[bool, str]:
    """One source of 300 documents, and a mixture of two by 3:1 in tokens: the manifests' paths."""
    single = prepared(folder / "single", count=300, docs_per_shard=100)[0].manifest.uri
    parts = two_sources(folder / "two", sizes=(240, 60))
    specs = [SourceSpec("web", str(parts["web"]), 0.75), SourceSpec("books", str(parts["books"]), 0.25)]
    mixed = prepare_mixture(specs, folder / "mix", budget=20000).manifest.uri
    return {False: single, True: mixed}


def main(runs: int = 10) -> None:
    logs = Path(tempfile.mkdtemp(prefix="stoker-text-elastic-"))
    (logs / "single").mkdir()
    (logs / "two").mkdir()
    data = make_data(logs)
    result = header("text_elastic", "torch", "pyzmq") | {"runs_per_shape": runs, "shapes": {}, "logs": str(logs)}
    rows = []
    for name in [s.name for s in SHAPES] + ["node-lost-and-added"]:
        shape = next((s for s in SHAPES if s.name == name), None)
        outcomes = []
        for i in range(runs):
            busy = i % 2 == 1
            outcome = (run_once(data[shape.mixture], shape, busy, logs) if shape else elastic_once(busy, logs)) | \
                {"busy": busy}
            outcomes.append(outcome)
            verdict = "pass" if outcome["passed"] else f"FAIL: {outcome['why']} ({outcome.get('out', '')})"
            gap = f", longest gap {outcome['longest_gap_s']} s" if "longest_gap_s" in outcome else ""
            print(f"{name} run {i + 1}/{runs}{' (busy)' if busy else ''}: {verdict}{gap}", flush=True)
        gaps = [o["longest_gap_s"] for o in outcomes if "longest_gap_s" in o]
        passed, busy_passed = sum(o["passed"] for o in outcomes), sum(o["passed"] for o in outcomes if o["busy"])
        result["shapes"][name] = {"passed": passed, "runs": runs, "busy_passed": busy_passed,
                                  "busy_runs": sum(o["busy"] for o in outcomes),
                                  "longest_gap_s": max(gaps, default=None),
                                  "median_longest_gap_s": statistics.median(gaps) if gaps else None,
                                  "runs_detail": outcomes}
        gap_cells = f"{max(gaps):.1f} | {statistics.median(gaps):.1f}" if gaps else "(not measured) | "
        rows.append(f"| {name} | {passed} of {runs} | {busy_passed} of {sum(o['busy'] for o in outcomes)} | "
                    f"{gap_cells} |")
    table = ("| shape | passed | of them beside two busy loops | longest gap after a change, s (worst run) "
             "| median run's longest gap, s |\n|---|---|---|---|---|\n" + "\n".join(rows))
    print(table)
    write_results("text_elastic", result, table)


if __name__ == "__main__":
    main()
