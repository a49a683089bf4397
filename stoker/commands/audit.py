"""`stoker audit`: every sample once per epoch? Read back from the step records a job's ranks kept."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from stoker.options import emit_json, json_option


def add_parser(sub) -> None:
    audit = sub.add_parser("audit", help="each epoch's samples (documents) delivered, duplicated, skipped and "
                                         "missing, from the step records a job's ranks kept (StepRecorder)")
    audit.add_argument("records", help="the folder the job's StepRecorders wrote (job.json, steps-rank-R.jsonl)")
    json_option(audit, "the audit")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every recorded epoch is exactly once, 1 when one is not (2: no records to read)."""
    from stoker.accel.step_record import audit

    result = audit(args.records)
    if args.json:
        emit_json(args.json, {"exactly_once": result.exactly_once, "steps": result.steps, "torn_lines": result.torn,
                              "epochs": [asdict(e) | {"exactly_once": e.exactly_once} for e in result.epochs]},
                  "audit")
    if args.json != "-":
        for epoch in result.epochs:
            print(epoch.line())
        print(f"{result.steps} step records read" + (f", {result.torn} torn lines not counted (a rank killed while "
                                                      "writing one)" if result.torn else ""))
    return 0 if result.exactly_once else 1
