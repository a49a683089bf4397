"""stoker/pipeline/store/open_shards.py: what a worker process keeps open, and a bad shard refused once, not
crashed on."""

from __future__ import annotations

import pytest

from stoker.pipeline.store.open_shards import OpenShards
from stoker.pipeline.store.shard_cache import CacheConfig, ShardCache
from stoker.pipeline.store.shards import Manifest
from tests.shard_edits import reshard


@pytest.fixture(scope="module")
def six(manifest, tmp_path_factory) -> Manifest:
    def short(index, rows):
        return rows[:-3] if index == 4 else rows

    bad = reshard(manifest, tmp_path_factory.mktemp("six"), 20, edit=short)
    bad.shards[4].num_samples += 3  # the manifest says 20, the shard holds 17
    bad.save(bad.uri)
    return Manifest.load(bad.uri)


def test_a_bad_shard_is_refused_once_and_answers_with_its_reason(six, tmp_path):
    shards = OpenShards(six, ShardCache(CacheConfig(tmp_path)))
    reason = shards.reader(4)
    assert reason == "shard train-00004.arrow: 17 rows, the manifest says 20"
    assert shards.reader(4) == reason and shards.take_events() == {"refused:rows": 1}
    assert shards.take_events() == {}


def test_shards_no_unit_holds_are_closed_beyond_the_last_few(six, tmp_path):
    shards = OpenShards(six, ShardCache(CacheConfig(tmp_path)), idle_keep=1)
    with shards.holding([0, 1]):
        first = shards.reader(0)
        shards.reader(1)
        with shards.holding([2]):
            shards.reader(2)
        assert set(shards.readers) == {0, 1, 2}  # 2 is idle now, and the one idle kept
        shards.reader(3)  # read outside any hold: idle, and 2 goes
        assert set(shards.readers) == {0, 1, 3}
    assert set(shards.readers) == {1}  # released in order: 0, then 1; one kept
    assert shards.reader(0) is not first  # opened again
    shards.close()
    assert shards.readers == {}
