"""What the dispatcher says of waiting ranks: a silent rank once, the stall line once per report bound, the
failure line past the stall timeout, and the metrics."""

import logging

from stoker.accel.control.dispatcher import Dispatcher
from stoker.accel.control.failures import STALLED, failure_kind
from stoker.accel.control.metrics import ControlMetrics
from stoker.accel.control.serving.stall_report import StallReporter, phase_label
from stoker.accel.control.watchdog import StallBounds, Watchdog
from stoker.pipeline.plan import EpochPlan


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _reporter(manifest, clock, world_size: int = 1):
    dispatcher = Dispatcher(EpochPlan(manifest, 32, 2, 0, world_size), clock=clock)
    dispatcher.attach_rank(0, "tcp://127.0.0.1:1")
    metrics = ControlMetrics()
    reporter = StallReporter(Watchdog(StallBounds(report_s=60, fail_s=300), clock), metrics, clock)
    clock.now += 1000  # the dispatcher has run a while
    return dispatcher, metrics, reporter


def _value(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels)


def test_a_silent_rank_is_said_once_until_it_attaches_again(manifest, caplog):
    _, metrics, reporter = _reporter(manifest, Clock())
    with caplog.at_level(logging.ERROR, "stoker.dispatcher"):
        reporter.silent([1], 60.0)
        reporter.silent([1], 60.0)
        assert _value(metrics, "stoker_dispatcher_ranks_silent") == 1
        reporter.attached(1)
        reporter.silent([1], 60.0)
        reporter.silent([], 60.0)
    said = [r.getMessage() for r in caplog.records if "has not been heard from" in r.getMessage()]
    assert said == ["rank 1 has not been heard from for 60 s: its batches wait, and the job cannot finish without "
                    "it (restart every rank from the last state_dict)"] * 2
    assert _value(metrics, "stoker_dispatcher_ranks_silent") == 0


def test_the_stall_line_is_said_once_per_report_bound_and_the_job_fails_past_the_timeout(manifest, caplog):
    clock = Clock()
    dispatcher, metrics, reporter = _reporter(manifest, clock)
    assert reporter.watch(dispatcher) is None and dispatcher.stall == ""
    assert _value(metrics, "stoker_rank_waiting_seconds", rank="0") == 0
    with caplog.at_level(logging.ERROR, "stoker.dispatcher"):
        reporter.watchdog.rank_waiting(0, 70)
        assert reporter.watch(dispatcher) is None
        clock.now += 10
        reporter.watchdog.rank_waiting(0, 80)
        assert reporter.watch(dispatcher) is None  # within the report bound: not said again
    stalled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stalled: ")]
    assert len(stalled) == 1 and stalled[0].endswith("(the job fails at 300 s: --stall-timeout)")
    assert dispatcher.stall.startswith("rank 0 has waited 80 s for its next batch")
    assert _value(metrics, "stoker_rank_waiting_seconds", rank="0") == 80
    clock.now += 230
    reporter.watchdog.rank_waiting(0, 310)
    failure = reporter.watch(dispatcher)
    assert failure is not None and failure.startswith("no batch for 310 s (--stall-timeout 300): rank 0 has waited")
    assert failure_kind(failure) == STALLED  # what stoker_job_failed counts it under
    reporter.watchdog.rank_waiting(0, 0)
    assert reporter.watch(dispatcher) is None and dispatcher.stall == ""


def test_a_holders_phase_is_a_label_of_a_closed_set():
    """A heartbeat's phase is a peer's text: a worker's own phases pass, anything else is counted as other."""
    assert [phase_label(p) for p in ("transforming", "waiting for credit", "unknown")] == \
        ["transforming", "waiting for credit", "unknown"]
    assert {phase_label(p) for p in ("x" * 100_000, "transforming\n", "Transforming", "")} == {"other"}


def test_a_rank_quiet_after_the_last_batch_of_its_stream_is_said_at_info_and_not_counted(manifest, caplog):
    """A rank that finished ahead of the others is quiet, not lost: no error that the job cannot finish."""
    dispatcher, metrics, reporter = _reporter(manifest, Clock(), world_size=2)
    plan = dispatcher.plan
    last = plan.rank_units(plan.epochs - 1, 0)[-1]
    assert not dispatcher.rank_finished(0)
    dispatcher.progress.mark_done(last.unit_id)
    assert dispatcher.rank_finished(0)
    with caplog.at_level(logging.INFO, "stoker.dispatcher"):
        reporter.silent([0, 1], 60.0, dispatcher.rank_finished)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert errors == ["rank 1 has not been heard from for 60 s: its batches wait, and the job cannot finish without "
                      "it (restart every rank from the last state_dict)"]
    assert infos == ["rank 0 stepped the last batch of its stream and has not been heard from since (60 s): nothing "
                     "waits for it"]
    assert _value(metrics, "stoker_dispatcher_ranks_silent") == 1
