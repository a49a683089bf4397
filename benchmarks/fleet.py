"""The fleet's demonstration: one pool of emulated hosts shared by a ResNet-50 job and a BERT job,
then a third job, a host SIGKILLed mid-move, the fleet SIGKILLed and started again, and the BERT job's
end, each with how long the fleet took (issue 36's demonstration, made by the fleet itself).

`stoker lab up --fleet`: 4 hosts, each a network namespace with a CPU quota of 0.3 core and 2 worker
processes; the fleet and the jobs (simulated devices at their A100 profile rates, ResNet-50 at 0.2
scale, BERT at length 512 whole) in the accelerator's namespace. The plan is this machine's own: one
core's rate for each dataset, calibrated here (one pinned core, CPU time), gives each job's cores;
each job starts at that estimate (`--fleet-start-cores`). The benchmark reads the fleet's /metrics
every half second and each job's closing summary. Needs root (namespaces and cgroup quotas).

    python -m benchmarks fleet
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from benchmarks.report import header, write_results
from stoker.accel.backends.profiles import profile_rate
from stoker.accel.control.fleet_member import HEADROOM
from stoker.calibrate import _pinned, imagenet_rate, wikipedia_entry
from stoker.datasets import default_imagenet, default_wikipedia
from stoker.pipeline.store.shards import Manifest

HOSTS, PROCS, CORES_PER_HOST = 4, 2, 0.3  # 1.2 cores of the machine's 2 for workers: the rest for the jobs' consumers
RESNET_SCALE, BERT_SEQ_LEN = 0.2, 512
CALIBRATE_SECONDS = 10.0
STALL_OK = 0.02
SHORT_READ_AFTER_S = 15.0  # the short fleet's shares and stalls are read this long after they settled
STABLE_S = 10.0  # an allocation that holds this long, with every stall under STALL_OK, has converged
JOBS = {"job0": "resnet", "job1": "bert", "job2": "resnet-w2"}


@dataclass
class Watch:
    """The fleet's /metrics every half second, in a thread: per job (by lab name) its processes, target,
    wanted cores and stall; the fleet's hosts and processes."""

    fleet_url: str
    ids: dict[str, str] = field(default_factory=dict)  # lab name -> job id
    timeline: list[dict] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop.wait(0.5):
            values = _scrape(self.fleet_url)
            if values is None:
                continue
            point = {"t": round(time.monotonic() - start, 1), "hosts": values.get("stoker_fleet_hosts", 0),
                     "processes": values.get("stoker_fleet_processes", 0), "jobs": {}}
            for name, job_id in list(self.ids.items()):
                held = values.get(f"stoker_fleet_job_processes{{job={job_id}}}")
                if held is not None:
                    point["jobs"][name] = {
                        "processes": held, "target": values[f"stoker_fleet_job_target{{job={job_id}}}"],
                        "cores_wanted": round(values[f"stoker_fleet_job_cores_needed{{job={job_id}}}"], 3),
                        "missing": round(values[f"stoker_fleet_job_cores_missing{{job={job_id}}}"], 3),
                        "stall": round(values[f"stoker_fleet_job_stall_fraction{{job={job_id}}}"], 4)}
            self.timeline.append(point)

    def latest(self) -> dict:
        return self.timeline[-1] if self.timeline else {"t": 0.0, "jobs": {}, "hosts": 0}

    def held(self, name: str) -> float:
        return self.latest()["jobs"].get(name, {}).get("processes", 0.0)


def _scrape(url: str) -> dict[str, float] | None:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        return None
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def _wait(predicate, timeout_s: float, what: str) -> float:
    """Seconds until `predicate` held; RuntimeError naming `what` past the timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.25)
    raise RuntimeError(f"{what} did not happen within {timeout_s:.0f} s")


def calibrated() -> dict[str, float]:
    images, text = Manifest.load(str(default_imagenet())), Manifest.load(str(default_wikipedia()))
    return {"resnet": _pinned(lambda: imagenet_rate(images, CALIBRATE_SECONDS)),
            "bert": _pinned(lambda: wikipedia_entry(text, CALIBRATE_SECONDS, seq_len=BERT_SEQ_LEN))["per_core_rate"]}


def planned_cores(rates: dict[str, float]) -> dict[str, float]:
    """The plan: each device's rate over one core's, the cores that keep it fed (before headroom)."""
    return {"resnet": profile_rate("a100", "imagenet", RESNET_SCALE) / rates["resnet"],
            "bert": profile_rate("a100", "wikipedia", 1.0) / rates["bert"]}


def job_args(kind: str, start_cores: float, seconds: float | None) -> list[str]:
    common = ["--accel", "simulated", "--profile", "a100", "--fleet-start-cores", f"{start_cores * HEADROOM:.3f}"]
    if kind == "bert":
        return [*common, "--dataset", "wikipedia", "--data", str(default_wikipedia()), "--seq-len",
                str(BERT_SEQ_LEN), "--scale", "1", "--epochs", "2", "--weight", "1"]
    weight = "2" if kind == "resnet-w2" else "1"
    return [*common, "--data", str(default_imagenet()), "--scale", str(RESNET_SCALE), "--epochs", "1000",
            "--max-seconds", str(seconds), "--weight", weight]


def _job_id(member) -> str | None:
    values = _scrape(member.metrics)
    if not values:
        return None
    for key in values:
        if key.startswith("stoker_consumer_job_info{"):
            return key.split("job_id=")[1].split(",")[0].rstrip("}")
    return None


def _samples(member) -> float:
    values = _scrape(member.metrics) or {}
    return values.get("stoker_consumer_samples_total", 0.0)


def _stable_since(watch: Watch, names: list[str]) -> float | None:
    """The time the jobs' allocation has held since (targets reached, stalls under STALL_OK)."""
    since = None
    for point in watch.timeline:
        jobs = point["jobs"]
        ok = all(n in jobs and jobs[n]["processes"] == jobs[n]["target"] and jobs[n]["stall"] < STALL_OK
                 for n in names)
        since = (since if since is not None else point["t"]) if ok else None
    return since


def _at_target_for(watch: Watch, seconds: float) -> bool:
    """Every job has held its target for the last `seconds` (moves are done)."""
    recent = [p for p in watch.timeline if p["t"] >= watch.latest()["t"] - seconds]
    return len(recent) >= 2 * seconds - 1 and all(
        len(p["jobs"]) == len(watch.ids) and all(j["processes"] == j["target"] for j in p["jobs"].values())
        for p in recent)


def main() -> dict:
    os.environ.setdefault("STOKER_LAB_DIR", tempfile.mkdtemp(prefix="stoker-fleet-lab-"))
    from stoker.lab import cluster
    from stoker.lab.fleet_lab import FleetLab, job_summary, start_fleet, start_job

    rates = calibrated()
    plan = planned_cores(rates)
    print(f"calibrated (CPU time, one pinned core): {rates['resnet']:,.0f} images/s, {rates['bert']:,.0f} "
          f"sequences/s; plan: resnet {plan['resnet']:.2f} cores, bert {plan['bert']:.3f} cores", flush=True)
    state = FleetLab(cluster.LabConfig(hosts=HOSTS, cores_per_host=CORES_PER_HOST, procs=PROCS, fleet=True)).up([])
    watch = Watch(state.consumer.metrics)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    events: dict[str, object] = {}
    try:
        events |= _fleet_suffices(watch, start_job, plan)
        events |= _third_job_and_a_host_killed(watch, start_job, plan, cluster)
        events |= _fleet_restart(watch, state, start_fleet, cluster)
        events |= _bert_ends(watch, job_summary)
        summaries = {name: job_summary(name, timeout_s=600) for name in ("job0", "job2")}
        summaries["job1"] = events.pop("bert_summary")  # type: ignore[assignment]
    except BaseException:
        print(f"failed; the last reading: {json.dumps(watch.latest())}", file=sys.stderr)
        raise
    finally:
        watch.stop.set()
        cluster.down()
    result = {**header("fleet", "pyzmq"), "hosts": HOSTS, "procs_per_host": PROCS, "cores_per_host": CORES_PER_HOST,
              "calibrated_per_core": rates, "planned_cores": plan, "events": events,
              "exactly_once": {JOBS[n]: _once(s) for n, s in summaries.items()},
              "timeline": watch.timeline[::2]}
    write_results("fleet", result, table(result))
    print(table(result))
    return result


def _fleet_suffices(watch: Watch, start_job, plan: dict[str, float]) -> dict:
    """ResNet-50 and BERT on the whole fleet: how long until the allocation holds with both fed."""
    members = {"job0": start_job("job0", job_args("resnet", plan["resnet"], 260)),
               "job1": start_job("job1", job_args("bert", plan["bert"], None))}
    started = time.monotonic()
    for name, member in members.items():
        _wait(lambda m=member: _job_id(m) is not None, 60, f"{name}'s metrics")
        watch.ids[name] = _job_id(member)  # type: ignore[assignment]
    _wait(lambda: (s := _stable_since(watch, ["job0", "job1"])) is not None and watch.latest()["t"] - s >= STABLE_S,
          120, "the allocation of resnet and bert to hold with both fed")
    since = _stable_since(watch, ["job0", "job1"]) or 0.0
    t0 = watch.latest()["t"] - (time.monotonic() - started)
    jobs = watch.latest()["jobs"]
    per_process = CORES_PER_HOST / PROCS
    return {"converged_s": round(since - t0, 1),
            "suffices": {JOBS[n]: {**jobs[n], "cores": jobs[n]["processes"] * per_process,
                                   "planned_cores": round(plan[JOBS[n].split("-")[0]] * HEADROOM, 3)}
                         for n in ("job0", "job1")}}


def _third_job_and_a_host_killed(watch: Watch, start_job, plan: dict[str, float], cluster) -> dict:
    """A second ResNet-50 job of weight 2 arrives; at its first process, a host is SIGKILLed mid-move."""
    member = start_job("job2", job_args("resnet-w2", plan["resnet"], 260))
    _wait(lambda: _job_id(member) is not None, 60, "job2's metrics")
    watch.ids["job2"] = _job_id(member)  # type: ignore[assignment]
    arrived = time.monotonic()
    _wait(lambda: watch.held("job2") >= 1, 30, "the third job's first process")
    cluster.kill_host("h3")
    killed_at = time.monotonic() - arrived
    settled = _wait(lambda: watch.latest()["hosts"] == HOSTS - 1 and _at_target_for(watch, 5.0), 60,
                    "the shares on the smaller fleet")
    time.sleep(SHORT_READ_AFTER_S)  # the third job's start-up out of its stall window
    jobs = watch.latest()["jobs"]
    status = subprocess.run([sys.executable, "-m", "stoker", "status", "--metrics", watch.fleet_url],
                            capture_output=True, text=True).stdout
    return {"third_job_first_process_s": round(killed_at, 1), "host_killed_at_s": round(killed_at, 1),
            "shares_settled_after_kill_s": round(settled, 1),
            "short": {JOBS[n]: dict(jobs[n]) for n in jobs}, "status": status.strip().splitlines()}


def _fleet_restart(watch: Watch, state, start_fleet, cluster) -> dict:
    """SIGKILL the fleet, wait 3 s, start it again: the jobs go on meanwhile and their shares come back."""
    before = {n: watch.held(n) for n in ("job0", "job1", "job2")}
    members = cluster.current().members
    samples = {n: _samples(members[n]) for n in before}
    cluster._kill(state.consumer.pid, 9)
    killed = time.monotonic()
    time.sleep(3.0)
    grew = {JOBS[n]: _samples(members[n]) - samples[n] for n in before}
    watch.timeline.clear()  # readings from the fleet that runs again, only
    start_fleet(cluster.current())
    _wait(lambda: all(watch.held(n) == before[n] for n in before) and watch.latest()["hosts"] == HOSTS - 1,
          30, "the jobs' shares after the fleet's restart")
    back = time.monotonic() - killed
    return {"fleet_down_samples_stepped": grew, "shares_back_after_kill_s": round(back, 1)}


def _bert_ends(watch: Watch, job_summary) -> dict:
    """When BERT ends on the short fleet, its processes serve the ResNet jobs (which want more): from the
    first reading without BERT to the first where the ResNet jobs hold more than they did beside it."""
    summary = job_summary("job1", timeout_s=400)

    def resnet(point: dict) -> float:
        return sum(point["jobs"].get(n, {}).get("processes", 0.0) for n in ("job0", "job2"))

    def after_bert() -> tuple[dict, dict, dict] | None:
        points = list(watch.timeline)
        last = max((i for i, p in enumerate(points) if "job1" in p["jobs"]), default=None)
        if last is None or last + 1 >= len(points):
            return None
        gained = next((p for p in points[last + 1:] if resnet(p) > resnet(points[last])), None)
        return (points[last], points[last + 1], gained) if gained else None

    _wait(lambda: after_bert() is not None, 30, "bert's processes going to the resnet jobs")
    beside, gone, gained = after_bert()  # type: ignore[misc]
    return {"bert_processes": beside["jobs"]["job1"]["processes"], "resnet_processes_before": resnet(beside),
            "resnet_processes_after": resnet(gained), "bert_cores_to_resnet_s": round(gained["t"] - gone["t"], 1),
            "bert_summary": summary}


def _once(summary: dict) -> dict:
    """Every sample delivered at most once, and every epoch the job finished delivered whole (a
    time-boxed job stops part-way through its last)."""
    reached = [n for n in summary["per_epoch_unique"] if n > 0]
    whole = reached[:-1] if summary.get("time_boxed") else reached
    size = max(reached, default=0)
    return {"samples": summary["samples"], "unique": summary["unique_samples"],
            "duplicates_dropped": summary["duplicates_dropped"], "epochs_whole": len(whole),
            "every_sample_once": summary["samples"] == summary["unique_samples"] and all(n == size for n in whole),
            "time_boxed": bool(summary.get("time_boxed"))}


def table(result: dict) -> str:
    e = result["events"]
    lines = [f"Made by `python -m benchmarks fleet` on {result['when']}, {result['machine']}, {result['cpu']}; "
             + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + f". {result['hosts']} lab hosts x "
             f"{result['procs_per_host']} processes under a {result['cores_per_host']}-core quota each.", "",
             "| what | measured |", "|---|---|",
             f"| allocation converged, both fed (stall < {100 * STALL_OK:.0f}%) | {e['converged_s']} s after the jobs "
             f"started |"]
    for kind, j in e["suffices"].items():
        lines.append(f"| {kind} when the fleet suffices | {j['processes']:.0f} processes = {j['cores']:.2f} cores "
                     f"(plan {j['planned_cores']:.2f} with headroom), stall {100 * j['stall']:.1f}% |")
    lines.append(f"| third job (weight 2): first process | {e['third_job_first_process_s']} s (host h3 SIGKILLed "
                 f"then, mid-move) |")
    lines.append(f"| shares settled on 3 hosts after the kill | {e['shares_settled_after_kill_s']} s |")
    for kind, j in e["short"].items():
        lines.append(f"| {kind} on the short fleet | {j['processes']:.0f} processes (target {j['target']:.0f}), "
                     f"{j['missing']:.2f} cores missing, stall {100 * j['stall']:.1f}% |")
    lines.append("| fleet SIGKILLed for 3 s: samples stepped meanwhile | "
                 + ", ".join(f"{k} {v:,.0f}" for k, v in e["fleet_down_samples_stepped"].items()) + " |")
    lines.append(f"| the fleet SIGKILLed, started again 3 s later: every share back | "
                 f"{e['shares_back_after_kill_s']} s after the kill |")
    lines.append(f"| bert ends on the short fleet: its {e['bert_processes']:.0f} process(es) serve resnet "
                 f"({e['resnet_processes_before']:.0f} -> {e['resnet_processes_after']:.0f} processes) | "
                 + (f"{e['bert_cores_to_resnet_s']} s |" if e["bert_cores_to_resnet_s"] else
                    "within the same reading (0.5 s apart) |"))
    for kind, once in result["exactly_once"].items():
        lines.append(f"| {kind}: every sample once | {once['every_sample_once']} ({once['samples']:,} samples, "
                     f"{once['duplicates_dropped']} redone duplicates dropped, {once['epochs_whole']} whole epochs"
                     + (", time-boxed" if once["time_boxed"] else "") + ") |")
    return "\n".join(lines) + "\n\n`stoker status` on the short fleet:\n\n```\n" + "\n".join(e["status"]) + "\n```\n"


def rewrite_table() -> None:
    """The results file's table again from its JSON (after a change of wording, not of figures)."""
    from benchmarks.report import RESULTS

    result = json.loads((RESULTS / "fleet.json").read_text())
    (RESULTS / "fleet.md").write_text(table(result))


if __name__ == "__main__":
    print(json.dumps(main()["events"], indent=1, default=str))
