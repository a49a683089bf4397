"""Repeat: the tests behind a guarantee about processes, kills and timing, run again and again.

One green run proves little on a shared machine. This runs the named tests RUNS times each (default
10), every other run beside two busy loops (two cores' worth of competing work on this 2-core
machine), in one pytest process per run, at the tests' own settings (their defaults), and counts
the passes per test, quiet and busy. The guarantees it repeats by default:

- a Loader's worker processes die with it, on close() and when the training process is SIGKILLed;
- a finished job's daemons leave at once (each daemon heard "finished", not one of its processes);
- a `--once` daemon serves one job and leaves when another job takes its dispatcher's port;
- two `stoker run`s at their defaults on one machine both finish, on ports of their own.

A transform that hangs and a host out of processes (`python -m benchmarks repeat_hangs [RUNS]`, results in
repeat_hangs.{json,md}): a sample past the default --transform-timeout, interruptible and stuck in C
with its signal blocked, named once and waited on once in two epochs, the verdict `transform`; a
daemon asked for 8 processes in a pids cgroup of 25 says so in one line and loses nothing.

And a fleet's (`python -m benchmarks repeat_fleet [RUNS]`, results in repeat_fleet.{json,md}): every
sample of every job once through a host SIGKILLed mid-job, a host drained with SIGTERM, the fleet
SIGKILLed and started again, and processes moved between two running jobs by weight and back when one
ends (within 10 s).

The trainers' (`python -m benchmarks repeat_trainers [RUNS]`, results in repeat_trainers.{json,md}):
PyTorch Lightning's two epochs in full (it takes exactly len(loader) batches), its DDP ranks fed by one
daemon, a resume from its mid-epoch checkpoint; an `accelerate launch` of two processes SIGKILLed right
after a mid-epoch save_state and run again: every sample once per epoch.

A committed position's (`python -m benchmarks repeat_commits [RUNS]`, results in repeat_commits.{json,md}): two
torchft replica groups each SIGKILLed mid-step, and ranks of a committing job killed right after a unit's last
commit (twice in a row; and restarted only after the other finished), at the default timeouts: every step committed
once, every document once, the dispatcher done.

`python -m benchmarks repeat [RUNS]`; results: benchmarks/results/repeat.{json,md}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import header, write_results
from benchmarks.stability import busy_loops

ROOT = Path(__file__).parents[1]
GUARANTEES = (
    "tests/integration/test_local_workers.py::test_the_workers_die_with_the_loader_however_it_ends[close]",
    "tests/integration/test_local_workers.py::test_the_workers_die_with_the_loader_however_it_ends[SIGKILL]",
    "tests/integration/test_local_workers.py::"
    "test_a_finished_jobs_daemons_leave_at_once_not_after_the_dispatcher_is_gone",
    "tests/integration/test_lifecycle.py::test_a_once_daemon_serves_one_job_and_leaves_when_another_takes_its_port",
    "tests/integration/test_local_workers.py::"
    "test_two_stoker_runs_at_their_defaults_on_one_machine_both_finish_and_say_where_they_listen",
)
FLEET = "tests/integration/test_fleet.py::"
FLEET_GUARANTEES = (
    FLEET + "test_a_host_killed_mid_job_is_counted_gone_and_its_work_is_redone",
    FLEET + "test_a_host_drained_with_sigterm_hands_its_units_back",
    FLEET + "test_the_fleet_killed_and_started_again_loses_nothing",
    FLEET + "test_a_weighted_job_takes_processes_from_a_running_one_and_gives_them_back_when_it_ends",
)
HANG = "tests/integration/test_own_transform.py::" \
    "test_a_sample_whose_transform_passes_the_default_timeout_is_named_skipped_in_every_epoch_and_the_verdict_says_so"
HANG_GUARANTEES = (  # at the default --transform-timeout (30 s): about 95 s a run
    HANG + "[HangsOnOne-False]",
    HANG + "[StuckOnOne-True]",
    "tests/integration/test_lifecycle.py::"
    "test_a_host_out_of_processes_says_so_once_naming_the_limit_and_the_job_loses_nothing",
)
TRAINER_GUARANTEES = (  # about 100 s a run
    "tests/integration/test_lightning.py::test_a_two_epoch_trainer_steps_every_sample_once_in_each_epoch[plain-loader]",
    "tests/integration/test_lightning.py::test_ddp_ranks_fed_by_one_set_of_local_workers_step_every_sample_once",
    "tests/integration/test_lightning.py::"
    "test_a_run_resumed_from_a_mid_epoch_checkpoint_steps_only_what_the_checkpoint_had_not",
    "tests/integration/test_accelerate.py::"
    "test_accelerate_launch_run_again_after_a_crash_continues_from_load_state_every_sample_once",
)
COMMITS = "tests/integration/test_commit_restarts.py::"
COMMIT_GUARANTEES = (  # a committed position (issue 49): torchft replica groups, and ranks killed where acks die
    "tests/integration/test_torchft.py::"
    "test_replica_groups_killed_mid_step_and_restarted_commit_every_document_of_every_epoch_once",
    COMMITS + "test_a_rank_killed_twice_in_a_row_before_its_second_life_commits_is_fed_by_its_third[default-timeouts]",
    COMMITS + "test_a_rank_started_again_after_the_other_finished_the_job_completes_and_the_dispatcher_exits"
              "[default-timeouts]",
)
SETS = {"repeat": GUARANTEES, "repeat_fleet": FLEET_GUARANTEES, "repeat_hangs": HANG_GUARANTEES,
        "repeat_trainers": TRAINER_GUARANTEES, "repeat_commits": COMMIT_GUARANTEES}
RUN_TIMEOUT_S = 900.0


def run_once(tests: tuple[str, ...], busy: bool) -> dict[str, str]:
    """One pytest process over the tests: each test's outcome (passed, failed, error, missing)."""
    with tempfile.TemporaryDirectory() as folder, busy_loops(2 if busy else 0):
        report = Path(folder) / "report.json"
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
               f"--junitxml={report}", *tests]
        try:
            subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return dict.fromkeys(tests, "timed out")
        return _outcomes(report, tests)


def _outcomes(report: Path, tests: tuple[str, ...]) -> dict[str, str]:
    """Each test's outcome from pytest's JUnit XML (the standard report: no plugin needed)."""
    import xml.etree.ElementTree as ET

    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        outcome = "failed" if case.find("failure") is not None else "error" if case.find("error") is not None \
            else "skipped" if case.find("skipped") is not None else "passed"
        found[f"{module}::{case.get('name')}"] = outcome
    return {test: found.get(test, "missing") for test in tests}


def main(runs: int = 10, name: str = "repeat") -> None:
    """`name`: the set of guarantees (SETS), which names its results file too."""
    guarantees = SETS[name]
    result = header(name, "pyzmq", "numpy") | {"runs": runs, "tests": {}}
    outcomes: list[tuple[bool, dict[str, str]]] = []
    for i in range(runs):
        busy = i % 2 == 1
        started = time.monotonic()
        outcome = run_once(guarantees, busy)
        outcomes.append((busy, outcome))
        failed = [t.split("::")[-1] for t, o in outcome.items() if o != "passed"]
        print(f"run {i + 1}/{runs}{' (busy)' if busy else ''} in {time.monotonic() - started:.0f} s: "
              f"{'all passed' if not failed else 'NOT passed: ' + ', '.join(failed)}", flush=True)
    rows = ["| test | passed (of runs) | beside two busy loops |", "|---|---|---|"]
    for test in guarantees:
        passed = sum(o[test] == "passed" for _, o in outcomes)
        busy_passed = sum(o[test] == "passed" for busy, o in outcomes if busy)
        busy_runs = sum(busy for busy, _ in outcomes)
        result["tests"][test] = {"passed": passed, "runs": runs, "busy_passed": busy_passed, "busy_runs": busy_runs,
                                 "outcomes": [o[test] for _, o in outcomes]}
        rows.append(f"| `{test.split('::')[-1]}` | {passed} of {runs} | {busy_passed} of {busy_runs} |")
    table = "\n".join([f"Made by `python -m benchmarks {name} {runs}` on {result['when']}, {result['machine']}.", "",
                       *rows, ""])
    print(table)
    write_results(name, result, table)
    print(json.dumps({t: r["passed"] for t, r in result["tests"].items()}))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
