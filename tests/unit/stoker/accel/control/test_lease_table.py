"""Who holds what: a repeated request finds its unit, a release finds exactly its leases, and a
unit ended short avoids its host for a while, unless it is the only host."""

from stoker.accel.control.lease_table import Lease, LeaseTable
from tests.unit.stoker.accel.control.plans import small_plan


def test_a_repeated_request_gets_its_unit_while_the_lease_lasts_and_only_for_its_key():
    unit = small_plan().units(0)[0]
    table = LeaseTable()
    table.hold(Lease(unit, "h0", "h0/p1", 0.0, request_id=7, key="k"))
    assert table.answered("h0/p1", 7, "k") == unit
    assert table.answered("h0/p1", 7, "other") is None and table.answered("h0/p1", 8, "k") is None
    table.let_go(unit.unit_id)
    assert table.answered("h0/p1", 7, "k") is None and unit.unit_id not in table


def test_a_release_matches_host_workers_units_and_key():
    units = small_plan().units(0)
    table = LeaseTable()
    table.hold(Lease(units[0], "h0", "w1", 0.0, key="a"))
    table.hold(Lease(units[1], "h0", "w2", 1.0, key="a"))
    table.hold(Lease(units[2], "h1", "w1", 2.0, key="b"))
    assert [lease.unit for lease in table.matching("h0", None, None, None)] == units[:2]
    assert [lease.unit for lease in table.matching("h0", ["w2"], None, None)] == [units[1]]
    assert table.matching("h0", None, [units[2].unit_id], None) == []
    assert table.matching("h1", None, None, "a") == []
    assert [lease.unit for lease in table.older_than(1.5)] == units[:2]


def test_a_process_is_believed_one_held_unit_per_rank_and_only_its_own():
    plan = small_plan(world_size=2)
    mine, theirs = plan.rank_units(0, 0)[0], plan.rank_units(0, 1)[0]
    table = LeaseTable()
    table.hold(Lease(mine, "h", "w", 0.0))
    table.hold(Lease(theirs, "h", "other", 0.0))
    assert table.held_per_rank([mine.unit_id, theirs.unit_id], "h", "w", "", 2) == {0: mine}


def test_a_unit_ended_short_avoids_its_host_until_the_time_is_up_or_no_other_host_lives():
    table = LeaseTable()
    table.avoid(3, "h0", until=5.0)
    assert table.avoided(3, "h0", now=1.0, hosts_alive=2) and not table.avoided(3, "h1", now=1.0, hosts_alive=2)
    assert not table.avoided(3, "h0", now=1.0, hosts_alive=1)  # the only host: it may have it
    table.avoid(3, "h0", until=5.0)
    assert not table.avoided(3, "h0", now=5.0, hosts_alive=2)
