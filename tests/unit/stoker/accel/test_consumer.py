"""stoker/accel/consumer.py with fakes: a fake dispatcher, a fake worker feeding the real receiver on
the test's thread; no sockets, no processes. The end-to-end runs: tests/integration."""

from __future__ import annotations

import threading

import pytest

from stoker.accel.consumer import Consumer, JobFailed
from stoker.accel.control.link import DispatcherLink
from stoker.accel.control.remote import RankRefused
from stoker.accel.feed import Feed
from stoker.accel.receive_loop import END
from tests.unit.stoker.accel.fakes import CONFIG, PEER, SAMPLES, FakeDispatcher, InlineLoop, job, rank, send_job


def _fake(consumer: Consumer) -> FakeDispatcher:
    link: DispatcherLink = consumer.dispatcher  # what the consumer holds: the protocol, whichever link it is
    assert isinstance(link, FakeDispatcher)
    return link


def test_every_unit_is_acked_once_with_its_batches_and_the_summary_adds_up(monkeypatch, tmp_path):
    consumer = rank(monkeypatch, tmp_path, epochs=2)
    units = send_job(consumer)
    summary = consumer.run(procs_per_host=3)
    fake = _fake(consumer)
    assert sorted(fake.acks) == sorted((u.unit_id, -(-u.size // 4)) for u in units)  # once each, with its batches
    assert fake.finished and sorted(fake.received_units) == sorted(u.unit_id for u in units)
    assert (summary.samples, summary.unique_samples, summary.duplicates_dropped) == (2 * SAMPLES, 2 * SAMPLES, 0)
    assert summary.per_epoch_unique == [SAMPLES, SAMPLES]
    assert (summary.batches, summary.steps, summary.rows) == (10, 10, 2 * SAMPLES)  # 2 + 2 + 1 batches an epoch
    assert (summary.hosts, summary.procs_per_host, summary.epochs, summary.rank) == (1, 3, 2, 0)
    assert summary.frames_dropped == {} and summary.skipped == [] and not summary.time_boxed
    assert consumer.position == (2, 0)


def test_a_unit_sent_twice_is_stepped_and_acked_once(monkeypatch, tmp_path):
    consumer = rank(monkeypatch, tmp_path)
    units = send_job(consumer, repeat={0})
    summary = consumer.run()
    assert summary.samples == summary.unique_samples == SAMPLES
    assert summary.duplicates_dropped == units[0].size
    assert sorted(u for u, _ in _fake(consumer).acks) == sorted(u.unit_id for u in units)


def test_each_step_reaches_on_step_and_the_position_follows(monkeypatch, tmp_path):
    consumer = rank(monkeypatch, tmp_path, epochs=2)
    send_job(consumer)
    seen = []
    consumer.run(on_step=lambda c: seen.append(c.position))
    # steps 1..4 of an epoch's 5, then its last step moves the position to the next epoch's start
    assert seen == [(0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0)]


def test_a_stream_stopped_short_of_the_last_epoch_ends_the_run(monkeypatch, tmp_path):
    """A stop ends the stream mid-job (the receive loop queues its end): the run returns with what it stepped.
    It used to ask for a new pass of the ended stream for ever, a core spinning in a thread nobody joined."""
    consumer = rank(monkeypatch, tmp_path, epochs=2)
    send_job(consumer)
    loop = consumer.loop
    assert isinstance(loop, InlineLoop)

    def stop_after_two_steps(c: Consumer) -> None:
        if c.position == (0, 2):
            loop.messages.clear()
            while not loop.queue.empty():
                loop.queue.get_nowait()
            loop.queue.put(END)

    summaries = []
    running = threading.Thread(target=lambda: summaries.append(consumer.run(on_step=stop_after_two_steps)),
                               daemon=True)
    running.start()
    running.join(timeout=30)
    assert not running.is_alive(), "the run went on asking an ended stream for batches"
    assert summaries[0].steps == 2 and consumer.position == (0, 2)


def test_a_failed_job_ends_the_run_with_job_failed(monkeypatch, tmp_path):
    consumer = rank(monkeypatch, tmp_path)
    send_job(consumer)
    fake = _fake(consumer)

    def fail_after_the_first_step(c: Consumer) -> None:
        assert fake.on_failure is not None
        fake.on_failure("host h0 refused the job: no such transform")

    with pytest.raises(JobFailed, match="host h0 refused the job: no such transform"):
        consumer.run(on_step=fail_after_the_first_step)
    failed = [s for s in consumer.metrics.registry.collect() if s.name == "stoker_job_failed"][0].samples
    assert [(s.labels["reason"], s.value) for s in failed] == [("refused", 1.0)]  # the kind; the line is JobFailed's


def test_the_checkpoint_asks_the_dispatcher_where_the_ranks_stand(monkeypatch, tmp_path):
    consumer = rank(monkeypatch, tmp_path)
    send_job(consumer)
    states = []
    consumer.run(on_step=lambda c: states.append(c.state_dict()))
    fake = _fake(consumer)
    assert fake.positions == [(0, 1), (0, 2), (0, 3), (0, 4)]  # after the last step the job is over: nothing to ask
    assert [(s["epoch"], s["step"], s["ranks"]) for s in states] == [
        (0, 1, [[0, 1]]), (0, 2, [[1, 0]]), (0, 3, [[1, 1]]), (0, 4, [[2, 0]]), (1, 0, [[0, 0]])]


def test_stop_waits_for_what_the_dispatcher_link_says_it_waits_for(monkeypatch, tmp_path):
    consumer = rank(monkeypatch, tmp_path)
    fake = _fake(consumer)
    fake.still_busy = 3
    consumer.stop()
    assert fake.asked_busy == 4 and consumer.loop.stopping.is_set()


def test_a_rank_that_stops_before_its_last_step_does_not_wait_for_the_others_to_finish(monkeypatch, tmp_path):
    """Stopped early (a script's max_steps), with every batch of its stream already received: it used to wait
    the 60 s a finished rank gives the other ranks' last acks."""
    consumer = rank(monkeypatch, tmp_path, epochs=1)
    send_job(consumer)
    feed = Feed(consumer, format="numpy", overlap=False)
    batches = [next(iter(feed)) for _ in range(4)]
    loop = consumer.loop
    assert isinstance(loop, InlineLoop) and loop.receiver is not None
    while loop.messages:  # the last batch arrives before the script stops
        loop.receiver.handle([PEER, *loop.messages.pop(0)])
    assert consumer.order.done and len(batches) == 4  # every unit released, one step not taken
    consumer.stop()
    assert _fake(consumer).closed_done == [False]


def test_a_rank_that_took_its_last_step_waits_for_the_others_to_finish(monkeypatch, tmp_path):
    consumer = rank(monkeypatch, tmp_path, epochs=1)
    send_job(consumer)
    assert len(list(Feed(consumer, format="numpy", overlap=False))) == 5
    consumer.stop()
    assert _fake(consumer).closed_done == [True]


def test_the_stream_ends_at_once_for_a_job_resumed_after_its_end(monkeypatch, tmp_path):
    first = rank(monkeypatch, tmp_path)
    send_job(first)
    first.run()
    state = first.state_dict()
    resumed = Consumer(first.cfg, first.job, resume=state)
    resumed.start()
    assert isinstance(resumed.loop, InlineLoop) and resumed.loop.queue.get_nowait() is END
    summary = resumed.run()
    assert summary.batches == 0 and _fake(resumed).acks == []


def test_a_rank_outside_the_job_is_refused(tmp_path):
    with pytest.raises(RankRefused, match="rank 3 is outside the job's ranks 0..1"):
        Consumer(CONFIG, job(tmp_path, world_size=2), rank=3)
