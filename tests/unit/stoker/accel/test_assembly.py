"""stoker/accel/assembly.py: a rank's start in phases, each read alone (the whole rank: test_consumer.py)."""

from __future__ import annotations

from dataclasses import replace

from stoker.accel import checkpoint
from stoker.accel.assembly import (
    counted_at_epoch_end,
    credit_budget,
    identify,
    image_epoch_steps,
    join_job,
    load_data,
    past_epoch_end,
)
from stoker.accel.stepping import NullAccelerator
from tests.unit.stoker.accel.fakes import CONFIG, SAMPLES, job


def test_identity_is_a_rank_and_an_id_of_its_own():
    first, second = identify(CONFIG, 3, b"secret"), identify(CONFIG, 3, b"secret")
    assert first.rank == 3 and first.consumer_id.startswith("rank3-") and first.consumer_id != second.consumer_id
    assert first.given_credential == b"secret" and first.client_keys is None  # no keys: no key pair to load


def test_join_without_a_checkpoint_starts_nowhere_and_with_one_at_its_position(tmp_path):
    me = identify(CONFIG, 0, None)
    joined, position = join_job(CONFIG, job(tmp_path, epochs=2), me, None, None)
    assert position is None and joined.job.epochs == 2
    saved = checkpoint.state(joined.job, 1, 2, [(1, 0)], SAMPLES + 8)
    resumed, position = join_job(CONFIG, job(tmp_path, epochs=2), me, None, saved)
    assert (position.epoch, position.step) == (1, 2) and resumed.job.job_id == joined.job.job_id


def test_the_data_phase_makes_the_null_step_and_starts_at_the_beginning(tmp_path):
    data = load_data(job(tmp_path), None, None)
    assert isinstance(data.step, NullAccelerator) and data.plan.samples_per_epoch == SAMPLES
    assert (data.start.epoch, data.start.step, data.start.ranks) == (0, 0, [(0, 0)])


def test_a_position_past_an_image_epochs_last_step_is_the_next_epochs_start(tmp_path):
    the_job = job(tmp_path, epochs=2)
    plan = load_data(the_job, None, None).plan
    steps = image_epoch_steps(the_job, plan, 0)
    assert steps == 5  # units of 8, 8 and 4 images in batches of 4
    at_end = checkpoint.Position(0, steps, [(3, 0)])
    assert (past_epoch_end(at_end, the_job, plan).epoch, past_epoch_end(at_end, the_job, plan).step) == (1, 0)
    inside = checkpoint.Position(0, steps - 1, [(2, 0)])
    assert past_epoch_end(inside, the_job, plan) is inside


def test_the_credit_budget_covers_two_windows_at_least(tmp_path):
    small = job(tmp_path)
    assert credit_budget(CONFIG, small) >= 2 * CONFIG.credit_window


def test_only_a_bert_job_of_several_ranks_counts_its_steps_at_the_epoch_end(tmp_path):
    """Its ranks meet at each epoch's end over their streams' counts: a rank's whole stream must be able to come in
    while it steps in lockstep with a rank that waits for its count (accel.credit, steps_wait_on_stream;
    tests/integration/test_text_lockstep.py)."""
    images, bert = job(tmp_path, world_size=2), replace(job(tmp_path), dataset="wikipedia", world_size=2)
    alone = replace(bert, world_size=1)
    assert [counted_at_epoch_end(j) for j in (images, bert, alone)] == [False, True, False]
