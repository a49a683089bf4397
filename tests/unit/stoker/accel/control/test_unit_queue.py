"""Units leave the queue in lease order, a released one goes back in its place, and at most
the epoch being leased and a part of the next are made."""

from stoker.accel.control.unit_queue import MAKE_AHEAD_UNITS, UnitQueue
from tests.unit.stoker.accel.control.plans import small_plan


def queue_of(plan, done=(), out=()):
    return UnitQueue(plan, is_done=lambda u: u in set(done), is_out=lambda u: u in set(out))


def test_units_come_in_lease_order_across_epochs_and_a_released_one_comes_first_again():
    plan = small_plan(samples=64, unit_size=8, epochs=3, world_size=2)
    queue = queue_of(plan)
    taken = []
    while (unit := queue.take(lambda unit: True)) is not None:
        taken.append(unit.unit_id)
        queue.make_ahead()
        assert len(queue) <= 2 * plan.units_per_epoch
    assert taken == [u.unit_id for e in range(plan.epochs) for u in plan.lease_order(e)]
    first = plan.lease_order(0)[0]
    queue.requeue(first)
    assert queue.take(lambda unit: True) == first


def test_a_unit_passed_over_keeps_its_place_and_done_units_are_dropped():
    plan = small_plan(samples=64, unit_size=8, epochs=1, world_size=2)
    order = plan.lease_order(0)
    queue = queue_of(plan, done=[order[0].unit_id])
    rank1 = queue.take(lambda unit: unit.rank == 1)
    assert rank1 == next(u for u in order[1:] if u.rank == 1)
    assert queue.take(lambda unit: True) == next(u for u in order[1:] if u != rank1)
    assert queue.open_of_rank(1)[1] == next(u for u in order if u.rank == 1 and u not in (order[0], rank1))


def test_a_reload_puts_back_only_units_neither_done_out_nor_pending():
    plan = small_plan(samples=40, unit_size=8, epochs=1)
    units = plan.lease_order(0)
    done = {units[0].unit_id}
    out = {units[1].unit_id}
    queue = queue_of(plan, done=done, out=out)
    assert len(queue) == 0 and queue.fill() and len(queue) == len(units) - 2
    queue.reload_from(0)
    assert len(queue) == len(units) - 2
    assert MAKE_AHEAD_UNITS > 0
