"""Issue 48's item 5 for token-stream jobs, a single packed source and a two-source mixture, with the real
processes the image tests use (tests/integration/test_data_parallel.py's torchrun DDP jobs and worker fleets,
test_fleet.py's `stoker fleet`): every planned document once per epoch through a killed host, a restart in
place with the daemons running and a resume at the same world size; the same batches (their tensors' bytes)
across runs and across a resume; `len(loader)` the same on every rank; the fleet serving a tokens job.
(A killed worker process: test_token_job.py and test_token_mixture.py.) At the default timeouts."""

from __future__ import annotations

import json
import os
import signal

import pytest

from stoker.accel.backends.accelerators import SimulatedAccelerator
from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.accel.control.fleet_seat import FleetSeat
from stoker.accel.stepping import given
from stoker.pipeline.job import JobConfig
from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.lm_layout import LMConfig
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from tests.helpers import Job, free_port, wait_for
from tests.integration.test_data_parallel import Fleet, _batches_sent, _before, _job, _records, _run
from tests.integration.test_fleet import Fleet as StokerFleet
from tests.integration.test_fleet import _tree, finished, hosts
from tests.token_corpus import prepared, two_sources

LM = ("--lm-seq-len", "64", "--batch-size", "8")
DEFAULT_HOST_TIMEOUT = str(ConsumerConfig.host_timeout_s)


@pytest.fixture(scope="module", params=["packed", "mixture"])
def token_set(request, tmp_path_factory) -> Manifest:
    """97 documents of one source (the ranks' streams differ by one), or 3:1 of two sources by a budget."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "packed":
        return prepared(folder, count=97, docs_per_shard=40)[0].manifest
    parts = two_sources(folder, sizes=(160, 40))
    specs = [SourceSpec("web", str(parts["web"]), 0.75), SourceSpec("books", str(parts["books"]), 0.25)]
    return Manifest.load(prepare_mixture(specs, folder / "mix", budget=6000).manifest.uri)


@pytest.fixture
def stoker_fleet(log_dir):
    started = StokerFleet(log_dir)
    yield started
    started.stop()


def _planned(manifest: Manifest, epochs: int) -> list[list[int]]:
    """Each epoch's planned sample ids, sorted (a mixture's repeats are ids of their own)."""
    plan = JobConfig(manifest_uri=manifest.uri, dataset="tokens", epochs=epochs, batch_size=8, lm=LMConfig(64)).plan(
        manifest)
    return [sorted(int(i) for unit in plan.units(epoch) for i in unit.sample_ids()) for epoch in range(epochs)]


def _check(manifest: Manifest, ranks: dict[int, dict], epochs: int, epochs_from: int = 0) -> None:
    """Every planned document once per epoch, equal steps on every rank, and len(loader) the same on every
    rank and exact (the steps the epoch took) at the epoch's start and at every step of it."""
    planned = _planned(manifest, epochs)
    for epoch in range(epochs_from, epochs):
        streams = [[s for s in ranks[r]["steps"] if s["epoch"] == epoch] for r in ranks]
        assert len({len(s) for s in streams}) == 1 and streams[0], f"epoch {epoch}: unequal steps"
        ids = sorted(i for stream in streams for s in stream for i in s["ids"])
        assert ids == planned[epoch], f"epoch {epoch}: not every planned document exactly once"
        for r, stream in zip(ranks, streams, strict=True):
            assert [s["step"] for s in stream] == list(range(len(stream)))
            assert ranks[r]["len"].get(epoch, len(stream)) == len(stream), f"epoch {epoch}: len(loader) not exact"
            assert {s["len_now"] for s in stream} == {len(stream)}, f"epoch {epoch}: len(loader) moved in the epoch"


def _batches(steps: list[dict]) -> list[tuple]:
    return [(s["epoch"], s["step"], s["ids"], s["digest"]) for s in steps]


def test_a_token_jobs_host_killed_mid_epoch_loses_and_repeats_no_document(token_set, tmp_path, log_dir):
    """A torchrun job fed by 2 hosts; host0 (daemon and process) is SIGKILLed once it has sent a batch, holding
    a lease: its units are leased again and every epoch holds each planned document once. Six epochs: a worker
    reads token shards fast enough that, in two, host0 had sometimes made all its units before the kill."""
    def kill_host0(fleet: Fleet) -> None:
        host0 = fleet.daemons[0]
        assert wait_for(lambda: _batches_sent(host0) >= 1, timeout=120, interval=0.01)
        for pid in host0.children():
            os.kill(pid, signal.SIGKILL)
        host0.proc.send_signal(signal.SIGKILL)

    ranks = _job(token_set, tmp_path / "run", log_dir, *LM, "--epochs", "6", "--host-timeout", DEFAULT_HOST_TIMEOUT,
                 ranks=1, during=kill_host0)
    assert ranks[0]["units_released"] > 0  # the dead host's leases went to the other host
    _check(token_set, ranks, 6)


def test_a_resumed_token_job_yields_exactly_the_batches_an_uninterrupted_one_does(token_set, tmp_path, log_dir):
    """The same job twice, then stopped mid epoch 1 and resumed at the same world size (one rank) from its
    state_dict: the batches (ids and tensor bytes) are the same in all three."""
    one = {"ranks": 1, "hosts": 2}
    whole = _job(token_set, tmp_path / "whole", log_dir, *LM, "--host-timeout", DEFAULT_HOST_TIMEOUT, **one)
    _check(token_set, whole, 2)
    stop = len([s for s in whole[0]["steps"] if s["epoch"] == 0]) + 2
    part = tmp_path / "part"
    first = _job(token_set, part, log_dir, *LM, "--stop-after", str(stop), "--host-timeout", DEFAULT_HOST_TIMEOUT,
                 **one)
    state = json.loads((part / "state.json").read_text())
    assert (state["epoch"], state["step"]) == (1, 2)
    rest = _job(token_set, part, log_dir, *LM, "--resume", "--host-timeout", DEFAULT_HOST_TIMEOUT, **one)
    for r in whole:
        assert _batches(first[r]["steps"]) == _batches(whole[r]["steps"][:stop]), f"rank {r}: a second run differs"
        assert _batches(first[r]["steps"] + rest[r]["steps"]) == _batches(whole[r]["steps"]), \
            f"rank {r}: the resumed job's batches differ from the uninterrupted job's"


def test_a_token_job_restarted_in_place_continues_exactly_once_while_the_daemons_run(token_set, tmp_path, log_dir):
    """A torchrun job fed by 2 long-lived daemons at the default --leave-after: it saves the position at step 4
    and dies at step 9 (no goodbye); the same command again from the state finishes, the daemons joining it,
    every planned document once per epoch."""
    port = free_port()
    out = tmp_path / "run"
    fleet = Fleet(port, log_dir, hosts=2, procs=1, once=False, leave_after=None)
    common = (*LM, "--host-timeout", DEFAULT_HOST_TIMEOUT)
    try:
        _run(token_set, out, port, 1, fleet, *common, "--save-at", "4", "--crash-after", "9", expect_code=1)
        state = json.loads((out / "state.json").read_text())
        first = _records(out, 1)
        _run(token_set, out, port, 1, fleet, *common, "--resume", timeout=120)
        rest = _records(out, 1, "-resumed")
        assert all(d.proc.poll() is None for d in fleet.daemons)  # the daemons live on, for the next job
    finally:
        fleet.stop()
    whole = {r: {"steps": _before(first[r]["steps"], state) + rest[r]["steps"], "len": rest[r]["len"]} for r in rest}
    _check(token_set, whole, 2)


def test_ddp_ranks_of_a_token_job_take_the_planned_steps_in_lockstep(token_set, tmp_path, log_dir):
    """2 torchrun DDP ranks (an all-reduce each step) on a tokens job fed by 2 hosts: every planned document once
    per epoch, the same steps on both ranks, and len(loader) the same on both and exact from each epoch's first
    step. They hung at the end of epoch 0 once (a short rank waited for the long rank's step count, which the
    long rank gave only after steps the short one never took); now each rank's steps come from the plan and the
    documents' token counts, so no rank waits on another."""
    ranks = _job(token_set, tmp_path / "run", log_dir, *LM, "--epochs", "2", "--host-timeout", DEFAULT_HOST_TIMEOUT,
                 ranks=2)
    _check(token_set, ranks, 2)
    assert all(ranks[r]["len"].keys() == {0, 1} for r in ranks)


def test_a_fleets_hosts_serve_a_token_job_and_redo_a_killed_hosts_work(token_set, stoker_fleet, log_dir):
    """`stoker fleet` with 2 hosts of 2 processes: the tokens job is given all 4, one host is SIGKILLed mid-job,
    and the job still gets each planned document once per epoch."""
    fleet = stoker_fleet
    daemons = hosts(fleet, log_dir, 2, 2)
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=0,
                         seat=FleetSeat(fleet.endpoint))
    job_cfg = JobConfig(manifest_uri=token_set.uri, dataset="tokens", epochs=4, batch_size=8, unit_batches=2,
                        lm=LMConfig(64))
    job = Job(Consumer(cfg, job_cfg, given(SimulatedAccelerator(rate=150))), log_dir, start_workers=False)
    assert wait_for(lambda: fleet.held(job.consumer) == 4 and job.consumer.ledger.samples > 0, timeout=60), \
        fleet.output()
    for pid in _tree(daemons[0].proc.pid):  # the host's daemon, its job daemon and its processes at once
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: fleet.metrics()["stoker_fleet_hosts"] == 1, timeout=15), fleet.output()
    summary = finished(job, fleet)
    planned = [len(ids) for ids in _planned_of(job.consumer)]
    assert summary.samples == summary.unique_samples == sum(planned)
    assert summary.per_epoch_unique == planned


def _planned_of(consumer: Consumer) -> list[list[int]]:
    plan = consumer.plan
    return [[int(i) for unit in plan.units(epoch) for i in unit.sample_ids()] for epoch in range(plan.epochs)]
