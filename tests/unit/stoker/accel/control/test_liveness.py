"""Hosts by heartbeat and ranks by owner: who is alive, and who may take a rank."""

import pytest

from stoker.accel.control.liveness import Liveness, RankError


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_host_silent_past_the_timeout_is_expired_once_and_a_heartbeat_keeps_another():
    clock = Clock()
    live = Liveness(world_size=1, timeout_s=10, clock=clock)
    live.heartbeat("a")
    live.heartbeat("b")
    clock.now = 8
    live.heartbeat("b")
    clock.now = 10.5
    assert live.expired_hosts() == ["a"] and live.expired_hosts() == []
    assert live.live_hosts() == ["b"]


def test_a_rank_held_by_a_live_consumer_is_refused_to_another_until_it_is_silent():
    clock = Clock()
    live = Liveness(world_size=2, timeout_s=10, clock=clock)
    assert live.claim_rank(0, "c1") is False  # nobody held it
    with pytest.raises(RankError, match="already taken by consumer 'c1'"):
        live.claim_rank(0, "c2")
    clock.now = 5
    live.rank_heard(0, "c1")
    live.rank_heard(0, "c2")  # not its rank: changes nothing
    clock.now = 14
    with pytest.raises(RankError):
        live.claim_rank(0, "c2")
    assert live.silent_ranks() == []
    clock.now = 15.5
    assert live.silent_ranks() == [0]
    assert live.claim_rank(0, "c2") is True  # replaces c1: what c1 held is lost
    assert live.claim_rank(0, "c2") is False  # its own re-attach


@pytest.mark.parametrize("rank, world, match", [(2, 0, "outside the job's ranks 0..1"), (-1, 0, "outside"),
                                                (0, 3, "world size 2, not 3")])
def test_a_rank_outside_the_job_or_another_world_size_is_refused(rank, world, match):
    with pytest.raises(RankError, match=match):
        Liveness(world_size=2, timeout_s=10, clock=Clock()).claim_rank(rank, "c", world)


def test_a_rank_is_attached_once_its_data_socket_is_known():
    live = Liveness(world_size=1, timeout_s=10, clock=Clock())
    live.set_endpoint(0, "")
    assert not live.attached(0) and live.endpoint(0) is None
    live.set_endpoint(0, "tcp://127.0.0.1:1")
    assert live.attached(0) and live.endpoint(0) == "tcp://127.0.0.1:1"
