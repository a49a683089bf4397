"""Small plans built without a dataset on disk: a manifest names shards, nothing reads them."""

from stoker.pipeline.plan import EpochPlan
from stoker.pipeline.store.shards import Manifest, ShardInfo


def small_plan(samples: int = 40, unit_size: int = 8, epochs: int = 2, world_size: int = 1) -> EpochPlan:
    manifest = Manifest(kind="imagenet", classes=["a"], shards=[ShardInfo("s0", samples, 1, "", 0)])
    return EpochPlan(manifest, unit_size=unit_size, epochs=epochs, seed=0, world_size=world_size)
