"""stoker/pipeline/store/spill.py: a seeded shuffle of rows through a file, which is gone afterwards."""

from __future__ import annotations

import random

import pytest

from stoker.pipeline.store.spill import Spill


def _rows(n: int) -> list[tuple[str, int, bytes, bytes | None]]:
    return [(f"k{i}", i % 5, bytes([i % 256]) * (i + 1), b"idx" if i % 2 else None) for i in range(n)]


def test_every_row_comes_back_once_in_the_seeds_order(tmp_path):
    rows = _rows(600)
    orders = []
    for seed in (3, 3, 4):
        with Spill(tmp_path / "spill.arrow", rows_per_batch=64) as spill:
            for row in rows:
                spill.add(*row)
            orders.append(list(spill.shuffled(seed)))
        assert not (tmp_path / "spill.arrow").exists()
    order = list(range(600))
    random.Random(3).shuffle(order)
    assert orders[0] == orders[1] == [rows[i] for i in order]
    assert orders[2] != orders[0] and sorted(orders[2]) == sorted(rows)


def test_the_file_is_removed_when_the_work_fails(tmp_path):
    with pytest.raises(RuntimeError), Spill(tmp_path / "spill.arrow") as spill:
        spill.add("k", 0, b"x", None)
        raise RuntimeError("the source broke")
    assert not (tmp_path / "spill.arrow").exists()
    with Spill(tmp_path / "empty.arrow") as spill:
        assert list(spill.shuffled(0)) == []
