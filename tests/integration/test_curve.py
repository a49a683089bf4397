"""Authenticated, encrypted links: CURVE keys, the allow-list, and refusing exposure without keys."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import zmq

from stoker.accel.consumer import Consumer, ConsumerConfig
from stoker.pipeline.job import JobConfig
from stoker.protos.curve import ClientKeys, KeyFileError, ServerKeys, add_key, init_keys, list_keys
from tests.helpers import Daemon, assert_exactly_once, scrape, wait_for


def test_an_unknown_key_is_refused_and_never_reaches_a_batch(manifest, tmp_path, log_dir):
    keys = init_keys(tmp_path / "keys")
    add_key(keys, "good")
    rogue = init_keys(tmp_path / "rogue")  # a key pair nobody allow-listed ...
    add_key(rogue, "intruder")
    shutil.copy(keys / "server.key", rogue / "server.key")  # ... that knows the service's public key
    cfg = ConsumerConfig(data_bind="tcp://127.0.0.1:0", control_bind="tcp://127.0.0.1:0", metrics_port=0,
                         keys=str(keys))
    consumer = Consumer(cfg, JobConfig(manifest_uri=manifest.uri, epochs=1, batch_size=16, unit_batches=2))
    consumer.start()
    intruder = Daemon(consumer.control_endpoint, "intruder", 1, log_dir,
                      extra=("--keys", str(rogue), "--key-name", "intruder"))
    ctx = zmq.Context()
    keyless = ctx.socket(zmq.DEALER)  # no CURVE at all: fails the handshake before ZAP is even asked
    keyless.setsockopt(zmq.LINGER, 0)
    keyless.connect(consumer.data_endpoint)
    keyless.send(b"hello?")
    try:
        refused = "stoker_consumer_auth_total{result=refused}"
        assert wait_for(lambda: scrape(consumer.metrics_port).get(refused, 0) >= 1, timeout=30), intruder.output()
        failed = "stoker_consumer_auth_total{result=failed_handshake}"
        assert wait_for(lambda: scrape(consumer.metrics_port).get(failed, 0) >= 1, timeout=30)
        good = Daemon(consumer.control_endpoint, "good", 1, log_dir, extra=("--keys", str(keys), "--key-name", "good"))
        summary = consumer.run()
        assert good.wait(timeout=30) == 0, good.output()
        assert_exactly_once(summary, manifest.num_samples, 1)
        hosts = consumer.dispatcher.dispatcher.liveness.live_hosts()  # the link's Dispatcher (this rank runs it)
        assert summary.hosts == 1 and hosts == ["good"]  # the intruder never registered
        assert summary.frames_dropped == {}  # and nothing it sent was even parsed
        metrics = scrape(consumer.metrics_port)
        assert metrics[refused] >= 1 and metrics["stoker_consumer_auth_total{result=admitted}"] >= 2
    finally:
        ctx.destroy(linger=0)
        intruder.stop()
        consumer.stop()


def test_binding_beyond_loopback_needs_keys_or_insecure(manifest, tmp_path):
    job = JobConfig(manifest_uri=manifest.uri)
    exposed = ConsumerConfig(data_bind="tcp://0.0.0.0:0", control_bind="tcp://127.0.0.1:0", metrics_port=None)
    with pytest.raises(ValueError, match="without CURVE keys"):
        Consumer(exposed, job)
    insecure = ConsumerConfig(data_bind="tcp://0.0.0.0:0", control_bind="tcp://127.0.0.1:0", metrics_port=None,
                              insecure=True)
    Consumer(insecure, job)  # allowed when asked for explicitly
    keys = init_keys(tmp_path / "keys")
    keyed = ConsumerConfig(data_bind="tcp://0.0.0.0:0", control_bind="tcp://0.0.0.0:0", metrics_port=None,
                           keys=str(keys))
    Consumer(keyed, job)


def test_keys_cli_makes_lists_and_refuses_to_overwrite(tmp_path):
    stoker = [sys.executable, "-m", "stoker", "keys"]
    assert subprocess.run([*stoker, "init", str(tmp_path / "k")], capture_output=True).returncode == 0
    assert subprocess.run([*stoker, "add", str(tmp_path / "k"), "host-7"], capture_output=True).returncode == 0
    again = subprocess.run([*stoker, "init", str(tmp_path / "k")], capture_output=True, text=True)
    assert again.returncode == 2 and "refusing to replace" in again.stderr
    assert list_keys(tmp_path / "k")["workers"] == ["host-7"]
    with pytest.raises(KeyFileError, match="stoker keys init"):
        add_key(tmp_path / "nothing", "x")


def test_a_key_has_the_role_of_the_allow_list_it_is_in(tmp_path):
    keys = init_keys(tmp_path / "keys")
    add_key(keys, "cpu-0")
    add_key(keys, "rank-0", role="consumer")
    with pytest.raises(KeyFileError, match="already allow-listed as a worker"):
        add_key(keys, "cpu-0", role="consumer")
    server = ServerKeys.load(keys)
    roles = sorted(server.allowed.values())
    assert roles == ["consumer:rank-0", "worker:cpu-0"]
    assert ClientKeys.load(keys, "rank-0", role="consumer").public in server.allowed
    with pytest.raises(KeyFileError):
        ClientKeys.load(keys, "rank-0")  # not a worker key
