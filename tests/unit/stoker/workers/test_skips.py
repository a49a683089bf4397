"""stoker/workers/skips.py: a unit's skips are refreshed before each look, and read like the mapping they hold."""

from __future__ import annotations

from collections import ChainMap

from stoker.workers.skips import Skips


def test_each_look_refreshes_first_so_a_sample_made_poison_meanwhile_is_skipped():
    poison: dict[int, str] = {}
    looks: list[int] = []

    def refresh() -> None:
        looks.append(1)
        poison[7] = "hung elsewhere"

    skips = Skips(ChainMap({3: "in the lease"}, poison), refresh)
    assert 3 in skips and len(looks) == 1
    assert 7 in skips and skips[7] == "hung elsewhere" and len(looks) == 2
    assert sorted(skips) == [3, 7] and len(skips) == 2
    assert 9 not in skips
