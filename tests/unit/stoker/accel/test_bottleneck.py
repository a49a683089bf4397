"""stoker/accel/bottleneck.py: which stage bounds a job, from one window of counters."""

from __future__ import annotations

import http.server
import threading

import pytest

from stoker.accel.bottleneck import Totals, diagnose, read_status, watch_frame, whose


def _window(stall_s=0.0, step_s=9.0, decode=2.0, augment=0.5, wait=0.0, transit=0.01, queue=0, batches=100,
            rows=6400, cpu_wait=0.0, throttled=0.0, read_wait=0.0, measured=True,
            min_transit=float("inf")) -> tuple[Totals, Totals]:
    """Ten seconds of a job: counters at the start (all zero) and at the end."""
    end = Totals(at=10.0, stall_s=stall_s, step_s=step_s, rows=rows, batches=batches, received_batches=batches,
                 transit_s=transit * batches, wait_for_credit_s=wait, work_s={"decode": decode, "augment": augment},
                 queue_depth=queue, cpu_s=decode + augment, cpu_wait_s=cpu_wait, throttled_wait_s=throttled,
                 cpu_wait_batches=batches if measured else 0, read_wait_s=read_wait, min_transit_s=min_transit)
    return Totals(at=0.0, work_s={"decode": 0.0, "augment": 0.0}, queue_depth=queue), end


def test_a_device_that_never_waits_is_the_bottleneck():
    d = diagnose(*_window(stall_s=0.2, step_s=9.7, wait=8.0))
    assert d.stage == "compute" and d.stall_fraction == pytest.approx(0.02)


def test_busy_workers_and_a_waiting_device_name_the_larger_worker_stage():
    # 6,400 rows in 2 s of device time: it wants 3,200 rows/s; workers made them in 25 busy seconds
    # (256 rows per busy second), so 12.5 busy workers would feed it; 2.5 are busy now.
    d = diagnose(*_window(stall_s=8.0, step_s=2.0, decode=20.0, augment=5.0, wait=0.5))
    assert d.stage == "decode"
    assert d.cores_in_use == pytest.approx(2.5) and d.cores_needed == pytest.approx(12.5)
    assert diagnose(*_window(stall_s=8.0, step_s=2.0, decode=5.0, augment=20.0, wait=0.5)).stage == "augment"


def test_idle_workers_tell_a_full_link_from_slow_credit_by_transit_time():
    # 100 batches in 10 s: a 0.1 s device cycle. 0.3 s in transit: the link is full.
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.3)).stage == "wire"
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.002)).stage == "credit"


def test_a_long_transit_that_does_not_queue_is_the_links_latency_and_credit_must_cover_it():
    # every batch takes 0.3 s, none longer than the quickest: latency (a far link), not a full one
    latency = diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.3, min_transit=0.29))
    assert latency.stage == "credit" and "--credit-window" in latency.detail
    # the quickest took 0.05 s and the rest queue behind each other for 0.25 s more: the link is full
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, transit=0.3, min_transit=0.05)).stage == "wire"


def test_batches_queued_on_a_waiting_device_point_at_its_own_conversion():
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, wait=20.0, queue=3)).stage == "device_copy"


def test_too_few_samples_to_judge_say_so():
    assert diagnose(*_window(batches=1)).stage == "unknown"


def test_workers_that_wait_for_a_core_are_starved_not_short_of_credit_or_cores():
    # busy 10 s and runnable-but-waiting 10 s: half their runnable time went to other processes
    d = diagnose(*_window(stall_s=6.0, step_s=4.0, decode=8.0, augment=2.0, wait=0.2, cpu_wait=10.0))
    assert d.stage == "contention" and d.cpu_wait_fraction == pytest.approx(0.5)
    assert "waited 50% of their time for a core" in d.detail and "credit" not in d.detail
    quota = diagnose(*_window(stall_s=6.0, step_s=4.0, decode=8.0, augment=2.0, cpu_wait=10.0, throttled=9.0))
    assert quota.stage == "throttled" and "quota" in quota.detail


def _on_hosts(window: tuple[Totals, Totals], hosts: dict[str, tuple[float, float, float, int]]
              ) -> tuple[Totals, Totals]:
    """The window with per-host figures: host -> (CPU seconds, seconds waited for a core, cores, processes)."""
    _, end = window
    end.host_cpu_s = {h: cpu for h, (cpu, _, _, _) in hosts.items()}
    end.host_cpu_wait_s = {h: wait for h, (_, wait, _, _) in hosts.items()}
    end.host_cores = {h: cores for h, (_, _, cores, _) in hosts.items()}
    end.host_procs = {h: procs for h, (_, _, _, procs) in hosts.items()}
    return window


def test_more_worker_processes_than_cores_wait_for_each_other_and_are_short_of_cores_not_contended():
    # four processes on a host of two cores: 19 CPU seconds in 10 s, 19 s waited for a core (half)
    over = diagnose(*_on_hosts(_window(stall_s=6.0, step_s=4.0, decode=15.0, augment=4.0, cpu_wait=19.0),
                               {"host0": (19.0, 19.0, 2.0, 4)}))
    assert over.stage == "decode" and "short of cores" in over.detail, over.detail
    assert "4 processes on 2 cores of host0 (each waits 50% for the others)" in over.detail
    assert "other processes" not in over.detail and "not processes" in over.detail
    # as many processes as cores, the same wait: others take the CPU
    shared = diagnose(*_on_hosts(_window(stall_s=6.0, step_s=4.0, decode=15.0, augment=4.0, cpu_wait=19.0),
                                 {"host0": (19.0, 19.0, 2.0, 2)}))
    assert shared.stage == "contention" and "other processes" in shared.detail
    # four on two cores waiting 80%: far more than they make each other wait, so neighbours take the rest
    crowded = diagnose(*_on_hosts(_window(stall_s=6.0, step_s=4.0, decode=4.0, augment=1.0, cpu_wait=20.0),
                                  {"host0": (5.0, 20.0, 2.0, 4)}))
    assert crowded.stage == "contention"
    # two hosts: most of the wait is on the one with a core per process
    mixed = diagnose(*_on_hosts(_window(stall_s=6.0, step_s=4.0, decode=20.0, augment=5.0, cpu_wait=12.0),
                                {"over": (19.0, 2.0, 2.0, 3), "shared": (6.0, 10.0, 4.0, 4)}))
    assert mixed.stage == "contention"
    # a quota that throttles an oversubscribed host is still the quota
    quota = diagnose(*_on_hosts(_window(stall_s=6.0, step_s=4.0, decode=4.0, augment=1.0, cpu_wait=5.0,
                                        throttled=5.0), {"host0": (5.0, 5.0, 0.5, 2)}))
    assert quota.stage == "throttled"


def test_emulated_hosts_of_one_machine_share_its_cores():
    # two hosts of two processes each, both on one 2-core machine (the lab, or `stoker run --hosts 2`):
    # four processes on two cores, though each host alone looks like two on two
    window = _on_hosts(_window(stall_s=6.0, step_s=4.0, decode=15.0, augment=4.0, cpu_wait=19.0),
                       {"host0": (9.5, 9.5, 2.0, 2), "host1": (9.5, 9.5, 2.0, 2)})
    window[1].host_machine = {"host0": ("boot-a", 2.0), "host1": ("boot-a", 2.0)}
    shared = diagnose(*window)
    assert shared.stage == "decode" and "4 processes on 2 cores of one machine (hosts host0, host1)" in shared.detail
    # the same two hosts on two machines: two processes on two cores each, so the wait is others'
    window[1].host_machine = {"host0": ("boot-a", 2.0), "host1": ("boot-b", 2.0)}
    assert diagnose(*window).stage == "contention"


def test_an_oversubscribed_machine_with_neighbours_too_says_both():
    # eight processes on two cores wait 75% for each other; they waited 89%: the rest is other processes
    both = diagnose(*_on_hosts(_window(stall_s=6.0, step_s=4.0, decode=8.0, augment=3.0, cpu_wait=89.0),
                               {"host0": (11.0, 89.0, 2.0, 8)}))
    assert both.stage == "decode" and "each waits 75% for the others; other processes took 14% more" in both.detail


def test_contention_on_the_consumers_own_machine_says_what_the_consumer_took():
    window = _on_hosts(_window(stall_s=6.0, step_s=4.0, decode=8.0, augment=2.0, cpu_wait=4.0),
                       {"host0": (10.0, 4.0, 2.0, 2)})
    window[1].host_machine, window[1].consumer_machine = {"host0": ("boot-a", 2.0)}, "boot-a"
    window[1].consumer_cpu_s = 4.0  # over the 10 s window: 0.4 cores
    found = diagnose(*window)
    assert found.stage == "contention"
    assert "this job's consumer runs on their machine and used 0.40 cores" in found.detail
    window[1].consumer_machine = "boot-b"
    assert "consumer" not in diagnose(*window).detail


def test_a_little_waiting_for_a_core_leaves_the_busy_workers_short_of_cores():
    d = diagnose(*_window(stall_s=8.0, step_s=2.0, decode=20.0, augment=5.0, wait=0.5, cpu_wait=2.0))
    assert d.stage == "decode" and "short of cores" in d.detail


def test_workers_waiting_for_reads_name_storage():
    assert diagnose(*_window(stall_s=6.0, step_s=4.0, decode=3.0, augment=1.0, read_wait=6.0)).stage == "storage"


def test_a_slow_store_beside_busy_neighbours_is_storage_while_the_reads_wait_the_longer():
    # busy 1 s, waiting for a core 1 s (half their runnable time), waiting on reads 8 s: a core of their own
    # would win back a tenth of their time, a faster store most of it
    mixed = diagnose(*_window(stall_s=9.0, step_s=1.0, decode=0.8, augment=0.2, cpu_wait=1.0, read_wait=8.0))
    assert mixed.stage == "storage" and mixed.cpu_wait_fraction == pytest.approx(0.5)
    # the same wait for a core with reads that wait less than it: contention
    assert diagnose(*_window(stall_s=9.0, step_s=1.0, decode=0.8, augment=0.2, cpu_wait=5.0,
                             read_wait=4.0)).stage == "contention"


def test_a_wait_for_a_core_that_was_not_measured_is_said_so_not_taken_as_none():
    d = diagnose(*_window(stall_s=8.0, step_s=2.0, decode=20.0, augment=5.0, measured=False))
    assert d.cpu_wait_fraction is None and "not measured" in d.detail
    assert diagnose(*_window(stall_s=0.1, measured=False)).detail == "the device waits 1.0% of the time"


def test_a_wait_that_began_before_the_window_never_makes_the_stall_exceed_the_window():
    assert diagnose(*_window(stall_s=10.05, step_s=0.0, decode=20.0, augment=5.0)).stall_fraction == 1.0


@pytest.fixture
def page():
    """A local HTTP server whose one page's body the test sets."""
    body = {"text": b""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body["text"])

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield body, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    thread.join(timeout=10)
    server.server_close()


def test_status_at_a_page_that_is_not_metrics_or_not_a_consumers_says_so_in_one_line(page):
    body, url = page
    body["text"] = b"<!DOCTYPE html><html><body>Grafana</body></html>\n"
    with pytest.raises(ValueError, match="is not a Prometheus metrics page .*pass a Stoker consumer's /metrics"):
        read_status(url)
    body["text"] = b"# TYPE node_load1 gauge\nnode_load1 0.5\n"
    with pytest.raises(ValueError, match="is not a Stoker consumer's metrics"):
        read_status(url)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "not a url", "ftp://127.0.0.1/metrics"])
def test_status_reads_only_http_urls(url):
    with pytest.raises(ValueError, match="is not an http:// or https:// URL"):
        read_status(url)


def _status(rows: float, job: dict | None) -> dict:
    """What read_status gives for a consumer's page, the figures --watch shows."""
    return {"job": job, "stage": "compute", "stall_fraction": 0.01, "cores_in_use": 1.0, "cores_needed": 0.5,
            "rows": rows, "hosts": {"host0": {"rows": rows, "cpu_s": 2.0}}, "text": ""}


def test_each_watch_frame_names_the_job_it_reads_as_plain_status_does():
    """`stoker status --watch` frames used to show only the URL: figures from a port another job had
    taken looked like this job's. Each frame now opens with the line plain `stoker status` opens with."""
    url = "http://127.0.0.1:9560/metrics"
    job = {"job_id": "a1b2", "dataset": "imagenet", "rank": "0", "pid": "4321"}
    frame = watch_frame(_status(100, job), _status(300, job), 2.0, url).splitlines()
    assert frame[0] == "job a1b2 (imagenet), rank 0, process 4321, at http://127.0.0.1:9560/metrics" == whose(job, url)
    assert frame[1].startswith("rows/s: 100 ") and frame[3].split()[:2] == ["host0", "100"]
    first = watch_frame(None, _status(100, None), 1.0, url).splitlines()
    assert first[0] == f"a consumer at {url} that does not say its job"


def test_a_watch_frame_of_a_dispatchers_metrics_shows_its_failure_not_a_traceback():
    frame = watch_frame(None, {"stage": "failed", "failure": "host h0 refused", "stalled": [],
                               "text": "the job failed: host h0 refused"}, 1.0, "http://127.0.0.1:9559/metrics")
    assert frame.splitlines() == ["the dispatcher at http://127.0.0.1:9559/metrics", "the job failed: host h0 refused"]


def test_time_in_transform_calls_past_their_limit_is_the_transform_not_contention():
    """A call asleep in C code uses no CPU while the processes' other waits make a contended share: the
    seconds the dispatcher counted past --transform-timeout name the transform instead."""
    old, new = _window(stall_s=6.0, step_s=4.0, decode=1.0, augment=0.2, cpu_wait=1.0)
    assert diagnose(old, new).stage == "contention"
    new.hung_s = 30.0
    hung = diagnose(old, new)
    assert hung.stage == "transform" and "30 s in transform calls that ran past --transform-timeout" in hung.detail
    new.hung_s = 0.1  # a trace of it (under 10% of their time) leaves the verdict to the other rules
    assert diagnose(old, new).stage == "contention"
