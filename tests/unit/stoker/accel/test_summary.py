"""stoker/accel/summary.py: one form for a rank's summary and a job's, and its JSON round trip."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stoker.accel.summary import STEADY, WHOLE_RUN, Summary, job_totals, rate_window


def _rank(rank: int, samples: int, stall: float, **more) -> Summary:
    return Summary(samples=samples, unique_samples=samples, duplicates_dropped=1, epochs=2, elapsed_s=10.0 + rank,
                   startup_s=1.0, delivered_samples_per_s=samples / 9, stall_fraction=stall, batches=samples // 4,
                   hosts=2 + rank, procs_per_host=1, skipped_samples=rank, skipped=[{"sample_id": rank}] * rank,
                   frames_dropped={}, units_released=0, stage_seconds={"step": 1.0},
                   per_epoch_unique=[samples // 2] * 2,
                   rank=rank, world_size=2, rows=samples, bottleneck=f"stage{rank}", bottleneck_detail=f"d{rank}",
                   cores_needed=1.5, cores_in_use=1.0, **more)


def test_a_job_adds_its_ranks_counts_and_takes_the_worst_stall_and_the_longest_time():
    ranks = [_rank(0, 100, 0.1), _rank(1, 60, 0.3)]
    job = job_totals(ranks)
    assert (job.samples, job.unique_samples, job.duplicates_dropped, job.batches, job.rows) == (160, 160, 2, 40, 160)
    assert job.per_epoch_unique == [80, 80] and job.skipped == [{"sample_id": 1}]
    assert (job.stall_fraction, job.bottleneck, job.bottleneck_detail) == (0.3, "stage1", "d1")
    assert (job.elapsed_s, job.hosts, job.cores_needed, job.cores_in_use) == (11.0, 3, 3.0, 2.0)
    assert job.rank is None and job.ranks == ranks and job.sequences is None  # images: no text figures


def test_ranks_interrupted_in_different_epochs_add_up_epoch_by_epoch():
    """A rank's list ends at the epoch it was in (not the job's 2**31 - 1): Ctrl-C may find one rank an epoch
    ahead of another, and the job's figures add what each was in (zip strict=True raised here)."""
    ranks = [_rank(0, 100, 0.1, interrupted=True), replace(_rank(1, 60, 0.3, interrupted=True),
                                                            per_epoch_unique=[30, 30, 5])]
    assert job_totals(ranks).per_epoch_unique == [80, 80, 5]


def test_text_figures_add_up_only_for_text():
    ranks = [_rank(0, 100, 0.1, sequences=30, tokens=900), _rank(1, 60, 0.3, sequences=20, tokens=500)]
    assert (job_totals(ranks).sequences, job_totals(ranks).tokens) == (50, 1400)


def test_the_json_round_trip_keeps_every_figure_and_ignores_what_a_printer_added():
    rank = _rank(1, 60, 0.3)
    data = json.loads(json.dumps(rank.as_dict()))
    assert "ranks" not in data
    assert Summary.from_dict({**data, "cores": {"cores_needed": 1}}) == rank
    job = job_totals([_rank(0, 100, 0.1), rank])
    again = Summary.from_dict(json.loads(json.dumps(job.as_dict())))
    assert again == job and again.ranks[1] == rank


def test_a_rank_whose_printer_nulled_its_cores_reads_back_with_defaults_and_adds_up():
    """`stoker train --accel null` writes cores_needed/cores_in_use as null; rank 0 reads that back and adds
    the ranks up (`stoker run --world-size 2 --accel null`), which raised TypeError on float + None."""
    data = {**_rank(1, 60, 0.3).as_dict(), "cores_needed": None, "cores_in_use": None}
    back = Summary.from_dict(json.loads(json.dumps(data)))
    assert (back.cores_needed, back.cores_in_use) == (0.0, 0.0)
    assert back.sequences is None  # a figure whose default is None stays None
    assert job_totals([_rank(0, 100, 0.1), back]).cores_needed == 1.5


def test_a_run_that_arrives_with_its_first_batch_has_its_rates_over_the_whole_run():
    """300 documents in 2 units came in the first batch or two: 3.6 s of start-up left 1 ms after it, and the
    rates over that millisecond read 342,238 documents/s and 338 cores busy. Under a second or two steps after
    start-up, the rates divide the whole run and the wait for the first batch counts as stall."""
    window, stall, why = rate_window(3.601, 3.6, 2, 0.0005)
    assert window == pytest.approx(3.601) and stall == pytest.approx(1.0, abs=1e-3)
    assert why is not None and "too short after start-up: 0.00 s and 1 step(s) after the first batch" in why
    window, _, why = rate_window(10.0, 1.0, 2, 0.0)  # 9 s after start-up but one step: no steady rate either
    assert window == 10.0 and why is not None


def test_a_steady_run_has_its_rates_over_the_run_after_start_up():
    window, stall, why = rate_window(10.0, 1.0, 20, 0.9)
    assert (window, stall, why) == (9.0, pytest.approx(0.1), None)


def test_a_jobs_rates_are_the_whole_runs_when_one_ranks_are_and_say_what_they_divide():
    steady, short = _rank(0, 100, 0.1), _rank(1, 60, 0.3, rates_over=WHOLE_RUN)
    assert (steady.rate_seconds(), short.rate_seconds()) == (9.0, 11.0)  # after start-up; the whole run
    assert job_totals([steady, short]).rates_over == WHOLE_RUN
    assert job_totals([steady, _rank(1, 60, 0.3)]).rates_over == STEADY
    again = Summary.from_dict(json.loads(json.dumps(short.as_dict())))
    assert again.rates_over == WHOLE_RUN
