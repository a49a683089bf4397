"""A sample that kills its process twice is skipped; memory stays bounded under a flood."""

from stoker.accel.control.poison import CRASHES_KEPT, POISON_CRASHES, PoisonList
from tests.unit.stoker.accel.control.plans import small_plan


def test_the_second_death_on_a_sample_makes_it_poison_and_says_so_once():
    poison = PoisonList()
    assert POISON_CRASHES == 2
    assert not poison.crashed(5, "h0/p0.1, SIGSEGV") and poison.why(5) == ""
    assert poison.crashed(5, "h1/p0.1, SIGSEGV")
    assert not poison.crashed(5, "h1/p0.2, SIGSEGV")
    assert "killed 2 worker processes" in poison.why(5) and "h1/p0.1" in poison.why(5)


def test_a_unit_lists_only_its_own_poison_samples():
    plan = small_plan()
    unit = plan.units(0)[0]
    inside = unit.segments[0].first_sample_id + unit.segments[0].start
    poison = PoisonList()
    for sample in (inside, 10_000):
        poison.crashed(sample, "x")
        poison.crashed(sample, "x")
    assert list(poison.in_unit(unit)) == [inside]


def test_a_flood_of_single_crashes_keeps_a_bounded_count():
    poison = PoisonList()
    for sample in range(3 * CRASHES_KEPT):
        poison.crashed(sample, "x")
    assert len(poison._crashes) == CRASHES_KEPT


def test_a_sample_past_its_time_limit_is_poison_at_once_and_its_seconds_are_counted_every_time():
    poison = PoisonList()
    assert poison.hung(7, "h0/p0.1, 30 s", 30.0) and "ran past --transform-timeout" in poison.why(7)
    assert not poison.hung(7, "h1/p0.1, 35 s, stuck in C code: killed", 35.0)  # already poison: said once
    assert poison.hung_samples == 1 and poison.hung_s == 65.0
    assert "h0/p0.1" in poison.why(7)
