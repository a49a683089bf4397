"""A host id belongs to the daemon heard under it within DAEMON_LIVE_BEATS heartbeats."""

from stoker.accel.control.serving.host_ids import DAEMON_LIVE_BEATS, HostIds


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_second_daemon_is_refused_until_the_first_is_silent_for_its_beats():
    clock = Clock()
    ids = HostIds(heartbeat_s=1.0, now=clock)
    assert ids.taken("h0", b"a") == ""
    clock.now += 1.0
    why = ids.taken("h0", b"b")
    assert "host id h0 is in use by a live daemon (its daemon was heard 1.0 s ago)" in why
    assert ids.taken("h0", b"a") == ""  # the first goes on, and is heard again
    clock.now += DAEMON_LIVE_BEATS + 0.5
    assert ids.taken("h0", b"b") == ""  # the first fell silent: the second takes the id
    assert ids.taken("h0", b"a") != ""


def test_the_table_is_bounded_and_a_forgotten_host_id_is_free():
    clock = Clock()
    ids = HostIds(heartbeat_s=1.0, now=clock, most=2)
    for host in ("h0", "h1", "h2"):
        assert ids.taken(host, host.encode()) == ""
    assert len(ids) == 2
    assert ids.taken("h0", b"other") == ""  # h0 was forgotten
