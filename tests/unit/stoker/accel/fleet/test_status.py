"""A fleet's /metrics in words: per job its processes, target, want, what it misses, stall and share."""

from __future__ import annotations

import json

from stoker.accel.fleet.status import fleet_status, is_fleet


def _values(**per_job: dict[str, float]) -> dict[str, dict[str, float]]:
    values = {"stoker_fleet_hosts": {"{}": 4.0}, "stoker_fleet_processes": {"{}": 8.0},
              "stoker_fleet_processes_idle": {"{}": 0.0}, "stoker_fleet_cores_needed": {"{}": 14.0},
              "stoker_fleet_cores_missing": {"{}": 6.0}}
    for job, figures in per_job.items():
        for name, value in figures.items():
            values.setdefault(f"stoker_fleet_job_{name}", {})[json.dumps({"job": job})] = value
    return values


def test_a_short_fleet_says_what_each_job_misses_and_to_add_hosts():
    values = _values(resnet={"processes": 6, "target": 6, "cores_needed": 10, "cores_missing": 4,
                             "stall_fraction": 0.3, "share": 0.75, "weight": 3},
                     bert={"processes": 2, "target": 2, "cores_needed": 4, "cores_missing": 2, "stall_fraction": 0.1,
                           "share": 0.25, "weight": 1})
    assert is_fleet(values) and not is_fleet({"stoker_bottleneck_info": {}})
    status = fleet_status(values, "http://f:9558/metrics")
    lines = status["text"].splitlines()
    assert lines[0] == ("fleet at http://f:9558/metrics: 4 hosts, 8 worker processes (0 idle); its jobs want 14.00 "
                        "cores, 6.00 missing: add hosts")
    assert lines[1] == ("job bert (weight 1): 2 processes (target 2), wants 4.00 cores, 2.00 missing; stall 10.0%; 25% "
                        "of the fleet")
    assert lines[2].startswith("job resnet (weight 3): 6 processes (target 6), wants 10.00 cores, 4.00 missing")
    assert status["jobs"]["resnet"]["missing"] == 4 and status["fleet"]["cores_missing"] == 6


def test_a_fleet_without_jobs_says_so():
    assert fleet_status(_values(), "u")["text"].endswith("no job is registered")
