"""stoker/accel/cost.py: rows per CPU-second, its spread over a run in bounded memory, and cores sized to their
value."""

from __future__ import annotations

import pytest

from stoker.accel.cost import MAX_CHUNKS, RateSpread, cores_text


def test_the_rate_is_all_rows_over_all_cpu_and_the_spread_its_chunks_percentiles():
    spread = RateSpread()
    for i in range(100):
        spread.add(64, 0.1 if i % 10 else 0.2)  # every tenth batch took twice the CPU
    assert spread.rate == pytest.approx(6400 / 11.0)
    low, high = spread.spread()
    assert low <= spread.rate <= high and high == pytest.approx(640)


def test_a_long_run_keeps_a_bounded_number_of_chunks():
    spread = RateSpread()
    for _ in range(100_000):
        spread.add(64, 0.1)
    assert len(spread.chunks) < MAX_CHUNKS and spread.rate == pytest.approx(640)
    assert spread.spread() == pytest.approx((640, 640))


def test_too_few_batches_give_no_spread():
    spread = RateSpread()
    spread.add(64, 0.1)
    assert spread.spread() is None and RateSpread().rate == 0.0


@pytest.mark.parametrize(("cores", "text"), [(0.0, "0"), (0.04, "0.04"), (0.0043, "0.0043"), (0.95, "0.95"),
                                             (4.04, "4.0"), (37.4, "37")])
def test_a_small_figure_is_not_rounded_away(cores, text):
    assert cores_text(cores) == text
