"""stoker/accel/joining.py without a dispatcher elsewhere (attaching to one: tests/integration/test_dispatch.py)."""

from __future__ import annotations

import pytest

from stoker.accel import checkpoint
from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.control.local import InProcessDispatcher
from stoker.accel.control.remote import RankRefused, RemoteDispatcher
from stoker.accel.joining import Joined, LinkServices, Member, dispatcher_for, join
from stoker.accel.metrics import ConsumerMetrics
from stoker.pipeline.store.shards import Manifest
from stoker.protos.leases import LeaseSigner
from tests.unit.stoker.accel.fakes import job

CFG = ConsumerConfig(metrics_port=None)


def test_the_given_job_takes_the_world_size_asked_for_and_refuses_a_rank_outside_it(tmp_path):
    given = job(tmp_path)
    joined = join(CFG, given, Member(1, "c1"), world_size=2)
    assert joined.job.world_size == 2 and (joined.lease_key, joined.credential) == (b"", b"")
    with pytest.raises(RankRefused, match="rank 2 is outside the job's ranks 0..1"):
        join(CFG, given, Member(2, "c2"), world_size=2)
    with pytest.raises(ValueError, match="give the job, or a dispatcher"):
        join(CFG, None, Member(0, "c0"), world_size=None)
    with pytest.raises(ValueError, match="the job is the dispatcher's"):
        join(ConsumerConfig(dispatcher="tcp://127.0.0.1:1"), given, Member(0, "c0"), world_size=None)


def _link(cfg: ConsumerConfig, tmp_path, rank: int, **fields):
    the_job = job(tmp_path, **fields)
    plan = the_job.plan(Manifest.load(the_job.manifest_uri))
    start = checkpoint.Position(0, 0, [(0, 0)] * the_job.world_size)
    services = LinkServices(ConsumerMetrics(), LeaseSigner.new(the_job.job_id), lambda reason, units: None, None)
    return dispatcher_for(cfg, Joined(the_job, b"", b"secret"), plan, start, Member(rank, f"c{rank}"), services), plan


def test_rank_zero_runs_the_dispatcher_here_and_the_others_link_to_it(tmp_path):
    here, plan = _link(CFG, tmp_path, 0)
    assert isinstance(here, InProcessDispatcher) and here.total_units == plan.total_units
    assert not here.socket.access.remote_consumers  # one rank: no peer may act as a consumer
    with pytest.raises(RankRefused, match="rank 1 attaches to rank 0's dispatcher"):
        _link(CFG, tmp_path, 1, world_size=2)
    there, plan = _link(ConsumerConfig(metrics_port=None, dispatcher="tcp://127.0.0.1:1"), tmp_path, 1, world_size=2)
    assert isinstance(there, RemoteDispatcher) and there.credential == b"secret"
    assert there.total_units == sum(len(plan.rank_units(e, 1)) for e in range(plan.epochs))
