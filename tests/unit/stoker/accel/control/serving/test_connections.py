"""Connections by their file descriptor: a closed one's leases go back after the grace, unless its peer came back."""

from stoker.accel.control.serving.connections import Connections


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_whose_connection_stays_closed_is_named_once_after_the_grace():
    clock = Clock()
    conns = Connections(clock, grace_s=1.0)
    conns.spoke(b"p0", 7)
    conns.leases_as(b"p0", "h", "h/p0.1")
    conns.closed(7)
    clock.now += 0.5
    assert conns.stayed_closed() == []
    clock.now += 0.5
    assert conns.stayed_closed() == [("h", "h/p0.1")] and conns.stayed_closed() == []


def test_a_peer_back_on_a_new_connection_is_not_named_and_a_queued_message_does_not_save_it():
    clock = Clock()
    conns = Connections(clock, grace_s=1.0)
    for peer, fd in ((b"back", 7), (b"gone", 8)):
        conns.spoke(peer, fd)
        conns.leases_as(peer, "h", peer.decode())
    conns.closed(7)
    conns.closed(8)
    conns.spoke(b"back", 9)  # reconnected
    conns.spoke(b"gone", 8)  # read after its connection closed: it was queued
    conns.spoke(b"gone", None)  # ... or on no known connection
    clock.now += 2
    assert conns.stayed_closed() == [("h", "gone")]


def test_an_unknown_connection_closing_changes_nothing_and_a_peer_that_never_leased_is_not_named():
    clock = Clock()
    conns = Connections(clock, grace_s=1.0)
    conns.closed(3)
    conns.spoke(b"rank", 4)
    conns.closed(4)
    clock.now += 5
    assert conns.stayed_closed() == []


def test_what_a_connection_attached_as():
    conns = Connections(Clock())
    assert conns.rank_of(b"c") is None
    conns.attach(b"c", 1, "consumer-1")
    assert conns.rank_of(b"c") == (1, "consumer-1")
