"""The fleet's book: hosts and jobs from their beats, placement of moves on hosts, and what a fleet
that started again learns back from the next beats."""

from __future__ import annotations

import pytest

from stoker.accel.fleet.book import FleetBook, Job
from stoker.protos.errors import ConfigError


def _book(**kw) -> FleetBook:
    return FleetBook(round_s=0.0, **kw)


def _job(job_id: str, want: float | None, weight: float = 1.0, endpoint: str = "", min_cores: int = 0,
         max_cores: int | None = None) -> Job:
    return Job(job_id, weight, min_cores, max_cores, want, endpoint or f"tcp://{job_id}:1")


def _texts(decisions) -> str:
    return "\n".join(d.text for d in decisions)


def test_a_host_that_joins_is_given_work_at_once():
    book = _book()
    book.job_beat(_job("a", 3, endpoint="tcp://a:1"), now=0.0)
    said = book.host_beat("h1", 4, {}, False, now=0.1)
    assert book.plan_for("h1") == {"a": ("tcp://a:1", 3)}
    assert "host h1 joined" in _texts(said) and "idle process on h1 -> job a" in _texts(said)


def test_idle_processes_go_to_the_host_with_most_free_and_jobs_not_yet_measured_share_the_idle_ones():
    book = _book()
    book.host_beat("h1", 2, {}, False, now=0.0)
    book.host_beat("h2", 3, {}, False, now=0.0)
    book.job_beat(_job("a", None, endpoint="tcp://a:1"), now=0.1)  # not measured: nobody else wants the rest
    assert book.holding() == {"a": 5}
    book.job_beat(_job("b", None, endpoint="tcp://b:1"), now=0.2)
    for t in range(3, 10):
        book.rebalance(now=t)
    assert book.holding() == {"a": 3, "b": 2} or book.holding() == {"a": 2, "b": 3}


def test_a_job_not_yet_measured_takes_one_process_from_a_hungry_job_and_only_idle_ones_beside_a_light_one():
    """Issue 50, item 4: a newcomer without an estimate costs a fed job at most its start (1 process), and
    what it holds beyond that goes back as soon as it measures less or another job wants more."""
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0)
    book.job_beat(_job("hungry", 9.0), now=0.0)
    book.job_beat(_job("new", None), now=0.1)
    for t in range(1, 6):
        book.rebalance(now=t)
    assert book.holding() == {"hungry": 3, "new": 1}
    assert "not measured yet: a start of 1 and the processes no other job wants, 1 in all" in \
        book.last.reasons["new"]
    book.job_beat(_job("hungry", 2.0), now=6.0)  # its need fell: the idle processes go to the newcomer
    for t in range(7, 12):
        book.rebalance(now=t)
    assert book.holding() == {"hungry": 2, "new": 2}
    book.job_beat(_job("new", 1.0), now=12.0)  # measured: it needs one
    book.job_beat(_job("hungry", 3.0), now=12.0)
    for t in range(13, 18):
        book.rebalance(now=t)
    assert book.holding() == {"hungry": 3, "new": 1}


def test_a_job_that_leaves_frees_its_processes_for_a_job_that_wants_them():
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0)
    book.job_beat(_job("a", 2, endpoint="tcp://a:1"), now=0.0)
    book.job_beat(_job("b", 4, endpoint="tcp://b:1"), now=0.0)
    assert book.holding() == {"a": 2, "b": 2}
    said = book.job_leaves("a", now=1.0)
    assert book.holding() == {"b": 4}
    assert "job a left" in _texts(said)
    assert book.share_of("b").missing == 0


def test_moves_are_damped_to_max_moves_a_round():
    book = _book(max_moves=1)
    book.host_beat("h1", 6, {}, False, now=0.0)
    book.job_beat(_job("a", 6, endpoint="tcp://a:1"), now=0.0)
    book.job_beat(_job("b", 6, weight=2.0, endpoint="tcp://b:1"), now=0.0)  # its target is 4
    assert book.holding() == {"a": 5, "b": 1}  # the one move of its joining round
    book.rebalance(now=1.0)
    assert book.holding() == {"a": 4, "b": 2}
    for t in range(2, 6):
        book.rebalance(now=t)
    assert book.holding() == {"a": 2, "b": 4}
    book.rebalance(now=7.0)
    assert book.holding() == {"a": 2, "b": 4}  # converged: nothing moves back


def test_rounds_wait_round_s_unless_a_host_or_job_comes_or_goes():
    book = FleetBook(round_s=1.0, max_moves=1)
    book.host_beat("h1", 4, {}, False, now=0.0)
    book.job_beat(_job("a", 4, endpoint="tcp://a:1"), now=0.0)
    book.job_beat(_job("b", 4, endpoint="tcp://b:1"), now=0.1)
    held = dict(book.holding())
    assert book.rebalance(now=0.5) == [] and book.holding() == held
    assert book.rebalance(now=1.2) != []


def test_a_silent_host_is_gone_and_its_processes_are_given_again_elsewhere():
    book = _book(host_timeout_s=5.0)
    book.host_beat("h1", 2, {}, False, now=0.0)
    book.host_beat("h2", 2, {}, False, now=0.0)
    book.job_beat(_job("a", 2, endpoint="tcp://a:1"), now=0.0)
    book.job_beat(_job("b", 2, endpoint="tcp://b:1"), now=0.0)
    book.host_beat("h2", 2, {}, False, now=4.0)
    book.job_beat(_job("a", 2, endpoint="tcp://a:1"), now=4.0)
    book.job_beat(_job("b", 2, endpoint="tcp://b:1"), now=4.0)
    said = book.expire(now=6.0)
    assert "host h1 is gone" in _texts(said)
    assert book.capacity() == 2 and book.holding() == {"a": 1, "b": 1}


def test_a_draining_host_gets_nothing_and_its_share_moves():
    book = _book()
    book.host_beat("h1", 2, {}, False, now=0.0)
    book.host_beat("h2", 2, {}, False, now=0.0)
    book.job_beat(_job("a", 4, endpoint="tcp://a:1"), now=0.0)
    said = book.host_beat("h1", 2, {"a": 2}, True, now=1.0)
    assert book.plan_for("h1") == {} and book.capacity() == 2
    assert "draining" in _texts(said)


def test_a_restarted_fleet_adopts_what_hosts_run_and_frees_what_no_job_claims_after_the_grace():
    book = _book(job_timeout_s=10.0)
    book.host_beat("h1", 4, {"a": 2, "gone": 2}, False, now=100.0)
    assert book.assigned["h1"] == {"a": 2, "gone": 2}  # adopted: nothing stops before the jobs beat again
    book.job_beat(_job("a", 2, endpoint="tcp://a:1"), now=100.5)
    assert book.plan_for("h1") == {"a": ("tcp://a:1", 2)}  # a job not registered (yet) is not in a plan
    assert "gone" in book.assigned["h1"]
    book.host_beat("h1", 4, {"a": 2}, False, now=105.0)
    book.job_beat(_job("a", 2, endpoint="tcp://a:1"), now=105.0)
    assert book.expire(now=105.0) == [] and "gone" in book.assigned["h1"]
    book.host_beat("h1", 4, {"a": 2}, False, now=110.5)
    book.job_beat(_job("a", 2, endpoint="tcp://a:1"), now=110.5)
    said = book.expire(now=110.6)
    assert "job gone has not registered since the fleet started" in _texts(said)
    assert book.assigned["h1"] == {"a": 2}


def test_a_host_that_comes_back_with_fewer_processes_sheds_the_excess():
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0)
    book.job_beat(_job("a", 4, endpoint="tcp://a:1"), now=0.0)
    book.host_beat("h1", 2, {"a": 4}, False, now=1.0)
    assert book.holding() == {"a": 2}


def test_a_silent_job_frees_its_processes():
    book = _book(job_timeout_s=3.0)
    book.host_beat("h1", 2, {}, False, now=0.0)
    book.job_beat(_job("a", 2, endpoint="tcp://a:1"), now=0.0)
    book.host_beat("h1", 2, {"a": 2}, False, now=2.0)
    said = book.expire(now=4.0)
    assert "job a is gone" in _texts(said) and book.holding() == {}


def test_a_host_offering_no_process_is_refused():
    with pytest.raises(ConfigError, match="a host offers 1 to 1024 processes"):
        _book().host_beat("h1", 0, {}, False, now=0.0)


def test_a_job_asking_beyond_the_fleet_is_told_what_it_misses():
    book = _book()
    book.host_beat("h1", 3, {}, False, now=0.0)
    book.job_beat(_job("a", 5, endpoint="tcp://a:1"), now=0.0)
    share = book.share_of("a")
    assert (share.target, share.holding, share.missing, share.fleet_procs) == (3, 3, 2, 3)


def test_cores_become_processes_at_the_fleets_cores_per_process():
    """Hosts that give each process half a core: a job needing 3 cores gets 6 processes, its limits too."""
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0, cores=2.0)
    book.host_beat("h2", 4, {}, False, now=0.0, cores=2.0)
    assert book.cores_per_process() == 0.5
    book.job_beat(_job("a", 3.0), now=0.1)
    assert book.holding() == {"a": 6}
    book.job_beat(_job("b", 10.0, max_cores=1, min_cores=1), now=0.2)
    assert book.ask_of(book.jobs["b"], 8).max_cores == 2 and book.ask_of(book.jobs["b"], 8).min_cores == 2
    assert book.processes_for(0.0) == 0 and book.processes_for(0.26) == 1


def test_a_host_that_says_no_cores_counts_one_per_process_and_more_cores_than_processes_count_as_processes():
    book = _book()
    book.host_beat("h1", 2, {}, False, now=0.0)
    book.host_beat("h2", 2, {}, False, now=0.0, cores=16.0)
    assert book.cores_per_process() == 1.0


def test_a_job_whose_weight_or_want_cannot_hold_is_refused():
    book = _book()
    with pytest.raises(ConfigError, match="weight must be a number from"):
        book.job_beat(_job("a", 1.0, weight=0.0), now=0.0)
    for want in (float("nan"), -1.0, 4.3e9, 1e300):
        with pytest.raises(ConfigError, match="not a number from 0 to"):
            book.job_beat(_job("a", want), now=0.0)
    assert book.jobs == {}


def test_a_second_live_daemon_under_a_host_id_is_refused_and_a_restarted_one_is_let_in():
    book = _book(host_timeout_s=5.0)
    book.host_beat("dup", 2, {}, False, now=0.0, pid=100)
    with pytest.raises(ConfigError, match="host id dup is in use by a live daemon .pid 100"):
        book.host_beat("dup", 1, {}, False, now=1.0, pid=200)
    assert book.hosts["dup"].procs == 2
    book.host_beat("dup", 1, {}, False, now=7.0, pid=200)  # the first fell silent: it restarted
    assert book.hosts["dup"].pid == 200 and book.capacity() == 1


def test_a_job_stalled_for_a_reason_on_the_workers_side_gets_one_more_process_while_idle_ones_wait():
    """Its measured need (CPU time) may not explain its stall (a transform that crashes its processes, a
    slow store): one more process to try, as long as it stalls, never beyond the fleet."""
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0)
    stalled = Job("a", 1.0, 0, None, 0.1, "tcp://a:1", stall_fraction=0.5, stage="credit")
    book.job_beat(stalled, now=0.0)
    assert book.holding() == {"a": 1}  # what it measures it needs; each stalled round, one more
    for t in range(1, 6):
        book.job_beat(Job("a", 1.0, 0, None, 0.1, "tcp://a:1", stall_fraction=0.5, stage="credit"), now=t)
    assert book.holding() == {"a": 4}
    fed = Job("a", 1.0, 0, None, 0.1, "tcp://a:1", stall_fraction=0.5, stage="compute")  # the device is slow
    for t in range(6, 12):
        book.job_beat(fed, now=t)
    assert book.holding() == {"a": 1}  # its surplus goes back, one a round


@pytest.mark.parametrize("stage", ["throttled", "contention"])
def test_a_job_stalled_because_its_hosts_cores_are_short_asks_only_what_it_measures(stage: str):
    """A quota that throttles its workers, or other work on their cores: a process more would share the same
    cores, and taking it from another job starves that one too (benchmarks/fleet_price.py found a light job
    throttled beside a hungry one asking for 4 processes, all taken from the hungry job)."""
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0)
    for t in range(6):
        book.job_beat(Job("a", 1.0, 0, None, 0.1, "tcp://a:1", stall_fraction=0.5, stage=stage), now=t)
    assert book.holding() == {"a": 1}


def test_min_cores_are_a_guarantee_even_beyond_what_the_job_measures_it_wants():
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0)
    book.job_beat(_job("a", 0.3, min_cores=2), now=0.0)
    assert book.holding() == {"a": 2}


def _lab(cores: float) -> FleetBook:
    """fleet_price's two jobs on 4 hosts of 2 processes: a hungry job (0.685 cores) and a light one (0.036)."""
    book = _book()
    for h in ("h1", "h2", "h3", "h4"):
        book.host_beat(h, 2, {}, False, now=0.0, cores=cores)
    book.job_beat(_job("hungry", 0.685 if cores < 2 else 6.85), now=0.1)
    book.job_beat(_job("light", 0.036 if cores < 2 else 0.36), now=0.2)
    for t in range(3, 12):
        book.rebalance(now=t / 10)
    return book


def test_on_hosts_short_of_cores_a_light_job_takes_a_whole_host_and_no_host_serves_two_jobs():
    """Processes on a host with a CPU quota share it: the light job beside a hungry one waits out the quota the
    hungry one spends (fleet_price: fed 0.76-0.84 beside it, 0.99 alone)."""
    book = _lab(cores=0.2)
    assert book.short_host_procs() == 2 and book.ask_of(book.jobs["light"], 8).want == 2
    assert book.holding() == {"hungry": 6, "light": 2}
    assert all(len(jobs) == 1 for jobs in book.assigned.values()), book.assigned


def test_on_hosts_with_a_core_a_process_a_light_job_asks_only_what_it_measures():
    book = _lab(cores=2.0)
    assert book.short_host_procs() == 0 and book.holding() == {"hungry": 7, "light": 1}


def test_on_short_hosts_idle_processes_go_first_to_a_host_the_job_runs_on():
    book = _book()
    book.host_beat("h1", 4, {}, False, now=0.0, cores=1.0)
    book.host_beat("h2", 4, {}, False, now=0.0, cores=1.0)
    book.job_beat(_job("a", 0.25), now=0.1)  # one process, rounded up to the host: 4, all on one host
    assert sorted(book.assigned[h].get("a", 0) for h in ("h1", "h2")) == [0, 4]
    book.job_beat(_job("b", 0.5), now=0.2)  # 2 processes, rounded up to 4: the other host whole
    assert all(len(jobs) == 1 for jobs in book.assigned.values()), book.assigned


def test_on_short_hosts_a_host_freed_between_two_jobs_that_share_another_ends_with_one_job_a_host():
    """Job c leaves its host; a and b, sharing the other, each get one of its processes: then a swap (each keeps
    its count) gives each a host of its own."""
    book = _book()
    for h in ("h0", "h1"):
        book.host_beat(h, 2, {}, False, now=0.0, cores=0.2)
    for job in ("a", "b", "c"):
        book.job_beat(_job(job, 0.15), now=0.1)  # 2 processes each: more than the fleet holds
    book.assigned = {"h0": {"a": 1, "b": 1}, "h1": {"c": 2}}
    said = _texts(book.job_leaves("c", now=0.2))
    for t in range(3, 10):
        said += "\n" + _texts(book.rebalance(now=t / 10))
    assert book.holding() == {"a": 2, "b": 2}
    assert sorted(book.assigned.values(), key=str) == [{"a": 2}, {"b": 2}], book.assigned
    assert "one job a host where processes share a CPU quota" in said
    assert _texts(book.rebalance(now=2.0)) == ""  # settled: no swap back and forth
