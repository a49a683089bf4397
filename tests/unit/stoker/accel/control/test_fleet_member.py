"""What a job asks a fleet for: its start estimate, then its measured need, up at once and down only
after it has held."""

from __future__ import annotations

import pytest

from stoker.accel.control.fleet_member import (
    DOWN_AFTER,
    HEADROOM,
    NOT_MEASURED,
    UP_AFTER,
    WARMUP_BEATS,
    DemandMeter,
    Need,
    summed,
)


def _diagnosis(cores_needed: float, stall: float = 0.0, stage: str = "compute") -> Need:
    return Need(True, cores_needed, stall, 1.0, stage)


def test_before_the_device_steps_the_start_estimate_stands():
    meter = DemandMeter(start=6, start_reason="planner")
    assert meter.update(NOT_MEASURED) == (6, "planner")
    assert DemandMeter(None, "fair share").update(_diagnosis(0.0))[0] is None


def _warm(meter: DemandMeter, cores: float = 99.0) -> None:
    """The start-up windows, which are not acted on whatever they say."""
    for _ in range(WARMUP_BEATS):
        meter.update(_diagnosis(cores))


def test_the_start_up_windows_are_not_acted_on():
    meter = DemandMeter(start=0.5, start_reason="planner")
    _warm(meter)
    assert meter.want == 0.5 and meter.reason == "planner"


def test_the_measured_need_plus_headroom_is_asked_once_it_has_risen_for_two_beats():
    meter = DemandMeter(start=1, start_reason="planner")
    _warm(meter)
    assert meter.update(_diagnosis(4.0, stall=0.3, stage="decode"))[0] == 1  # one beat: noise, perhaps
    assert UP_AFTER == 2
    want, reason = meter.update(_diagnosis(5.0, stall=0.3, stage="decode"))
    assert want == pytest.approx(4.6)  # the least of the run: 4 cores x 1.15
    assert "4.00 cores" in reason and "decode" in reason and f"+{100 * (HEADROOM - 1):.0f}%" in reason


def test_a_lower_need_is_asked_only_after_it_has_held():
    meter = DemandMeter(start=None, start_reason="")
    _warm(meter)
    high = 4.0 * HEADROOM
    assert meter.update(_diagnosis(4.0))[0] == pytest.approx(high)  # the first measured need, without a start
    for _ in range(DOWN_AFTER - 1):
        assert meter.update(_diagnosis(1.0))[0] == pytest.approx(high)
    assert meter.update(_diagnosis(4.0))[0] == pytest.approx(high)  # a noisy window: the count starts again
    for _ in range(DOWN_AFTER - 1):
        assert meter.update(_diagnosis(1.0))[0] == pytest.approx(high)
    assert meter.update(_diagnosis(1.0))[0] == pytest.approx(1.0 * HEADROOM)


def test_a_need_within_ten_percent_below_the_ask_keeps_it():
    meter = DemandMeter(start=None, start_reason="")
    _warm(meter)
    meter.update(_diagnosis(4.0))
    for _ in range(3 * DOWN_AFTER):
        assert meter.update(_diagnosis(3.8))[0] == pytest.approx(4.0 * HEADROOM)


def test_a_jobs_need_is_its_ranks_cores_summed_and_its_worst_stall():
    need = summed([Need(True, 1.5, 0.01, 1.0, "compute"), NOT_MEASURED, Need(True, 2.0, 0.2, 0.5, "decode")])
    assert need == Need(True, 3.5, 0.2, 1.5, "decode")
    assert summed([NOT_MEASURED]) == NOT_MEASURED and summed([]) == NOT_MEASURED
