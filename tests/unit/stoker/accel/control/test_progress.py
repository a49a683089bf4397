"""Done units fold into whole epochs; a rank's stream positions follow from its units' batches."""

from stoker.accel.control.progress import Progress
from tests.unit.stoker.accel.control.plans import small_plan


def test_a_whole_epoch_done_folds_into_one_number_and_unfolds_when_a_rank_starts_again():
    plan = small_plan(samples=40, unit_size=8, epochs=2)
    progress = Progress(plan)
    for unit in plan.units(0):
        assert not progress.is_done(unit.unit_id)
        progress.mark_done(unit.unit_id, batches=1)
    assert progress.close_done_epochs() and not progress.close_done_epochs()
    assert progress.done_below == plan.units_per_epoch and progress._done == set()
    assert progress.done_count == plan.units_in(0) and not progress.finished
    assert progress.done_units() == [u.unit_id for u in plan.units(0)]
    undone = progress.undo_rank(0, rank=0, units=2)  # its first two units were stepped; the rest were lost
    assert undone == plan.units_in(0) - 2 and progress.done_below == 0
    assert progress.done_count == 2


def test_positions_count_whole_units_then_the_batches_after_them():
    plan = small_plan(samples=40, unit_size=8, epochs=1)
    progress = Progress(plan)
    first, second = plan.rank_units(0, 0)[:2]
    progress.mark_done(first.unit_id, batches=3)
    assert progress.position(0, 2) == [(0, 2)]  # inside the first unit
    assert progress.position(0, 4) == [(1, 1)]  # past it, one batch into the next
    progress.mark_done(second.unit_id, batches=2)
    assert progress.position(0, 5) == [(2, 0)]
    progress.start_at(0, 0, units=2, batches_before=5)  # a resumed job: the counts of the first two are not known
    assert progress.position(0, 6) == [(2, 1)]


def test_an_epochs_steps_are_known_once_every_rank_reported_its_stream():
    progress = Progress(small_plan(world_size=2))
    assert progress.epoch_steps(0, 0, 5) is None
    assert progress.epoch_steps(0, 1, 4) == 5  # the longest stream


def test_images_know_a_units_batches_from_its_size_before_its_ack():
    plan = small_plan()
    progress = Progress(plan, planned_batches=lambda unit: 7)
    assert progress.batches_of(plan.units(0)[0]) == 7
    assert Progress(plan).batches_of(plan.units(0)[0]) is None


def test_a_rank_past_its_last_unit_is_in_its_last_batchs_pieces_and_one_inside_an_uncounted_unit_is_unsure():
    """Two positions hold at their own world size only: a rank whose units are all stepped is inside the pieces
    of its epoch's last batch (a rank short of steps splits it, and a cut there would lose the pieces ahead), and
    a text rank standing past the start of a unit whose batch count has not come (it may be past its end)."""
    plan = small_plan(samples=16, unit_size=8, epochs=1, world_size=2)
    progress = Progress(plan)
    mine = plan.rank_units(0, 0)
    for unit in mine:
        progress.mark_done(unit.unit_id, batches=1)
    where = progress.where(0, len(mine))
    assert where.split == [0] and where.unsure == [1] and where.here_only == [0, 1]
    progress.remember_batches({plan.rank_units(0, 1)[0].unit_id: 5})
    assert progress.where(0, 1).unsure == [] and progress.where(0, 0).here_only == []
