"""`stoker status --metrics FLEET_URL`: a fleet's jobs in words, from its /metrics.

Per job: the processes it holds and the fleet's target for it, what it wants (its measured need or
its estimate), how many it is missing, its device's stall and its share of the fleet; and for the
fleet: its hosts, processes, idle ones, and the cores every job wants and misses."""

from __future__ import annotations

import json


def is_fleet(values: dict[str, dict[str, float]]) -> bool:
    return "stoker_fleet_processes" in values


def fleet_status(values: dict[str, dict[str, float]], metrics_url: str) -> dict:
    def one(name: str) -> float:
        return next(iter(values.get(name, {"": 0.0}).values()))

    def per_job(name: str) -> dict[str, float]:
        return {json.loads(k)["job"]: v for k, v in values.get(name, {}).items()}

    held, target = per_job("stoker_fleet_job_processes"), per_job("stoker_fleet_job_target")
    wanted, missing = per_job("stoker_fleet_job_cores_needed"), per_job("stoker_fleet_job_cores_missing")
    stall, share, weight = (per_job("stoker_fleet_job_stall_fraction"), per_job("stoker_fleet_job_share"),
                            per_job("stoker_fleet_job_weight"))
    jobs = {job: {"processes": held[job], "target": target.get(job, 0.0), "wants": wanted.get(job, 0.0),
                  "missing": missing.get(job, 0.0), "stall_fraction": stall.get(job, 0.0),
                  "share": share.get(job, 0.0), "weight": weight.get(job, 1.0)} for job in sorted(held)}
    fleet = {"hosts": one("stoker_fleet_hosts"), "processes": one("stoker_fleet_processes"),
             "idle": one("stoker_fleet_processes_idle"), "cores_needed": one("stoker_fleet_cores_needed"),
             "cores_missing": one("stoker_fleet_cores_missing")}
    lines = [f"fleet at {metrics_url}: {fleet['hosts']:.0f} hosts, {fleet['processes']:.0f} worker processes "
             f"({fleet['idle']:.0f} idle); its jobs want {fleet['cores_needed']:.2f} cores"
             + (f", {fleet['cores_missing']:.2f} missing: add hosts" if fleet["cores_missing"] > 0.005 else "")]
    for job, j in jobs.items():
        lines.append(f"job {job} (weight {j['weight']:g}): {j['processes']:.0f} processes (target {j['target']:.0f}), "
                     f"wants {j['wants']:.2f} cores" + (f", {j['missing']:.2f} missing" if j["missing"] > 0.005 else "")
                     + f"; stall {100 * j['stall_fraction']:.1f}%; {100 * j['share']:.0f}% of the fleet")
    if not jobs:
        lines.append("no job is registered")
    return {"fleet": fleet, "jobs": jobs, "stage": "fleet", "text": "\n".join(lines)}
