"""stoker/accel/ledger.py: the consumer's books; a duplicate is refused and counted, a stranger's ids rejected."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.accel.ledger import InvalidBatch, Ledger, Step
from stoker.pipeline.plan import EpochPlan


@pytest.fixture
def plan(manifest) -> EpochPlan:
    return EpochPlan(manifest, unit_size=32, epochs=2, seed=0, world_size=1, batch_size=16)


def test_a_unit_is_done_once_every_batch_is_stepped_and_a_redelivery_is_a_duplicate(plan):
    ledger = Ledger(plan)
    unit = plan.units(0)[0]
    ids = np.array(unit.sample_ids())
    first, second = ids[:16], ids[16:]
    assert ledger.admit(0, unit.unit_id, 0, first) and ledger.admit(0, unit.unit_id, 1, second, last=True)
    assert ledger.received(unit.unit_id)
    assert ledger.stepped(0, unit.unit_id, 0, False, first, np.empty(0, np.int64)) == Step.OPEN
    assert ledger.stepped(0, unit.unit_id, 1, True, second, np.empty(0, np.int64)) != Step.OPEN
    assert not ledger.admit(0, unit.unit_id, 0, first)  # the same batch again
    assert (ledger.duplicate_batches, ledger.duplicate_samples) == (1, 16)
    assert ledger.unique_in_epoch(0) == 32 and ledger.collisions == 0


def test_ids_outside_the_unit_or_the_plan_are_invalid(plan):
    ledger = Ledger(plan)
    unit, other = plan.units(0)[0], plan.units(0)[1]
    with pytest.raises(InvalidBatch, match="outside unit"):
        ledger.admit(0, unit.unit_id, 0, np.array(other.sample_ids()[:4]))
    with pytest.raises(InvalidBatch, match="not in the job's plan"):
        ledger.admit(0, 10**9, 0, np.array([0]))
    with pytest.raises(InvalidBatch, match="belongs to epoch 0"):
        ledger.admit(1, unit.unit_id, 0, np.array(unit.sample_ids()[:4]))


def _step_whole_unit(ledger: Ledger, unit) -> Step:
    ids = np.array(unit.sample_ids())
    ledger.admit(unit.epoch, unit.unit_id, 0, ids, last=True)
    return ledger.stepped(unit.epoch, unit.unit_id, 0, True, ids, np.empty(0, np.int64))


def test_a_finished_epoch_is_kept_as_one_count_and_its_batches_stay_duplicates(manifest):
    plan = EpochPlan(manifest, unit_size=32, epochs=4, seed=0, world_size=2, batch_size=32)
    ledger = Ledger(plan, rank=1)
    for epoch in range(plan.epochs):
        for unit in plan.rank_units(epoch, 1):
            assert _step_whole_unit(ledger, unit) == Step.DONE
        assert ledger.open_epochs == 0  # no bitmap, no unit set left behind for a finished epoch
        assert ledger.unique_in_epoch(epoch) == sum(u.size for u in plan.rank_units(epoch, 1))
    again = plan.rank_units(0, 1)[0]
    assert not ledger.admit(0, again.unit_id, 0, np.array(again.sample_ids()))  # a redone unit of a closed epoch
    assert ledger.unique_samples == ledger.samples and ledger.collisions == 0


def test_another_ranks_units_do_not_close_an_epoch(manifest):
    plan = EpochPlan(manifest, unit_size=32, epochs=1, seed=0, world_size=2, batch_size=32)
    ledger = Ledger(plan, rank=0)
    ledger.restore({u.unit_id for u in plan.rank_units(0, 1)})  # a resume's done units, every rank's
    mine = plan.rank_units(0, 0)
    for unit in mine[:-1]:
        _step_whole_unit(ledger, unit)
    assert ledger.open_epochs == 1
    assert ledger.admit(0, mine[-1].unit_id, 0, np.array(mine[-1].sample_ids()), last=True)  # still wanted


def test_a_unit_part_stepped_at_another_world_size_is_whole_with_what_its_batches_say_was_stepped_before(plan):
    """A text unit resumed part-way (pipeline.remainder) sends only its later batches; they name the documents
    its earlier ones held, which the books count as the unit's without counting them delivered here."""
    ledger = Ledger(plan)
    unit = plan.units(0)[0]
    ids = np.array(unit.sample_ids())
    with pytest.raises(InvalidBatch):  # without them, the unit's last batch leaves documents out
        ledger.admit(0, unit.unit_id, 0, ids[20:], last=True)
    assert ledger.admit(0, unit.unit_id, 0, ids[20:], last=True, stepped_before=ids[:20])
    assert ledger.stepped(0, unit.unit_id, 0, True, ids[20:], np.empty(0, np.int64)) == Step.DONE
    assert ledger.samples == 12  # delivered here: the unit's rest only
    with pytest.raises(InvalidBatch, match="outside unit"):
        Ledger(plan).admit(0, unit.unit_id, 0, ids[20:], last=True, stepped_before=np.array([10_000]))
