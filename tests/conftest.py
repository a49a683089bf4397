"""Shared fixtures: a small real ImageNet-like set, its shards, and process helpers."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stoker.pipeline.images.synth import SynthConfig, generate
from stoker.pipeline.job import JobConfig
from stoker.pipeline.prepare import PrepareConfig, prepare_imagenet
from stoker.pipeline.store.shards import Manifest, ShardReader, ShardWriter
from tests.corrupt_jpegs import garbled, truncated, without_eoi
from tests.helpers import Daemon, Job
from tests.shard_edits import JOB, ROWS, expected_images, reshard, write_shard


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers by where a test lives and what it needs: `unit` (tests/unit and the static checks in
    tests/, no processes of ours beyond the test's), `integration` (tests/integration: real processes
    and sockets), `lab` (network namespaces and cgroups, as root: the tests that build emulated
    hosts), `serial` (tests whose assertion is a CPU-time rate or a verdict about contention: they run
    alone, after the rest, which `make test` runs two at a time). `pytest -m unit` runs in two
    minutes; `-m "not lab"` without root."""
    for item in items:
        path = Path(str(item.fspath))
        integration = "integration" in path.parts
        item.add_marker(pytest.mark.integration if integration else pytest.mark.unit)  # tests/*.py: unit
        if (integration and path.name in LAB_MODULES) or item.get_closest_marker("needs_namespaces"):
            item.add_marker(pytest.mark.lab)
        if path.name in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


LAB_MODULES = {"test_lab.py", "test_multinode.py", "test_sweep_point.py", "test_plan_check.py"}
# what another test beside them would change: a rate per CPU-second measured quiet and beside busy
# loops, a plan checked under an exact CPU quota, contention named from the workers' waits for a core
SERIAL_MODULES = {"test_cpu_time.py", "test_plan_check.py", "test_bottleneck.py", "test_sweep_point.py",
                  "test_report.py"}

TEST_IMAGES = 160


@pytest.fixture(autouse=True, scope="session")
def own_shard_cache(tmp_path_factory):
    """The tests' shard cache and check markers (and their processes') in a folder of their own, not ~/.cache."""
    if "STOKER_SHARD_CACHE" not in os.environ:
        os.environ["STOKER_SHARD_CACHE"] = str(tmp_path_factory.mktemp("shard-cache"))
    yield


@pytest.fixture(autouse=True)
def no_daemon_outlives_its_test():
    yield
    while Daemon.started:
        Daemon.started.pop().stop()


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a 64 kB tmpfs of its own, and a function that fills it to the last byte: a write there
    meets the real ENOSPC, as a checkpoint on a full disk does. Skipped, with the reason, where a
    tmpfs cannot be mounted (not root, or no mount namespace of our own to do it in)."""
    folder = tmp_path / "full"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield folder, lambda: _fill(folder)
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def _fill(folder: Path) -> None:
    """Write into `folder` until the file system has no byte left (smaller and smaller writes)."""
    with open(folder / "filler", "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1 << 8, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise


@pytest.fixture(scope="session")
def raw_images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("raw")
    generate(folder, SynthConfig(images=TEST_IMAGES, classes=4), processes=2, progress=False)
    return folder


@pytest.fixture(scope="session")
def manifest(raw_images, tmp_path_factory) -> Manifest:
    dst = tmp_path_factory.mktemp("shards")
    return prepare_imagenet(raw_images, dst, PrepareConfig(shard_bytes=4 << 20, progress=False, processes=2)).manifest


@pytest.fixture(scope="session")
def corrupt_manifest(manifest, tmp_path_factory) -> tuple[Manifest, str]:
    """The same samples with one JPEG truncated early in its entropy-coded data."""
    dst = tmp_path_factory.mktemp("corrupt")
    writer = ShardWriter(dst, target_bytes=4 << 20)
    victim = ""
    for index in range(len(manifest.shards)):
        reader = ShardReader(manifest.shard_uri(index))
        for row in range(len(reader)):
            data = bytes(reader.jpeg(row))
            if not victim:  # cut inside the first rows: any crop window reaches the cut
                victim = reader.key(row)
                data = data[: len(data) // 20]
            restarts = reader.restarts(row)  # the victim's index now points past its end
            writer.add(reader.key(row), reader.label(row), data, bytes(restarts) if restarts is not None else None)
    corrupt = Manifest(kind="imagenet", classes=manifest.classes, shards=writer.close())
    corrupt.save(dst / "manifest.json")
    return Manifest.load(dst / "manifest.json"), victim


@pytest.fixture(scope="session")
def broken_scans(manifest, raw_images, tmp_path_factory) -> tuple[Manifest, dict[str, str]]:
    """The first shard's first 40 samples, six of them as `stoker prepare` stores a file it cannot
    transcode (its original bytes, no restart index), broken in the scan (tests.corrupt_jpegs): four
    garbled, one cut inside its scan, one without its EOI marker. Returns the manifest and key -> how
    that sample is broken."""
    dst = tmp_path_factory.mktemp("broken-scans")
    originals = {path.stem: path for path in raw_images.rglob("*.JPEG")}
    breaks = [("garbled", garbled)] * 4 + [("truncated", truncated), ("without EOI", without_eoi)]
    reader, rows, broken = ShardReader(manifest.shard_uri(0)), [], {}
    for row in range(40):
        key, label, restarts = reader.key(row), reader.label(row), reader.restarts(row)
        if row % 7 == 3:  # rows 3, 10, ..., 38
            how, make = breaks[len(broken)]
            broken[key] = how
            rows.append((key, label, make(originals[key].read_bytes()), None))
        else:
            rows.append((key, label, bytes(reader.jpeg(row)), bytes(restarts) if restarts is not None else None))
    made = Manifest(kind="imagenet", classes=manifest.classes, shards=[write_shard(dst / "train-00000.arrow", rows)])
    made.save(dst / "manifest.json")
    return Manifest.load(dst / "manifest.json"), broken


@pytest.fixture(scope="session")
def sixteen(manifest, tmp_path_factory) -> Manifest:
    """The same samples in shards of exactly 16 rows: with tests.shard_edits.JOB each unit reads one shard."""
    return reshard(manifest, tmp_path_factory.mktemp("sixteen"), ROWS)


@pytest.fixture(scope="session")
def expected(sixteen) -> dict:
    """What each sample of `sixteen` trains as in epoch 0 of tests.shard_edits.JOB: id -> (image, label)."""
    return expected_images(sixteen, JobConfig(manifest_uri=sixteen.uri, **JOB))


@pytest.fixture
def log_dir(tmp_path) -> Path:
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


WIKI_DOCS = 1200


@pytest.fixture(scope="session")
def wiki_corpus(tmp_path_factory):
    """The first WIKI_DOCS real Wikipedia lead sections and BERT's real vocab.txt."""
    from stoker.pipeline.text.corpus import write_wikipedia

    return write_wikipedia(tmp_path_factory.mktemp("wiki-raw"), documents=WIKI_DOCS)


@pytest.fixture(scope="session")
def wiki_manifest(wiki_corpus, tmp_path_factory) -> Manifest:
    """Those documents tokenized into three Parquet shards."""
    from stoker.pipeline.text.prepare import TextPrepareConfig, prepare_wikipedia

    dst = tmp_path_factory.mktemp("wiki-shards")
    cfg = TextPrepareConfig(docs_per_shard=WIKI_DOCS // 3, progress=False)
    return prepare_wikipedia(wiki_corpus.text, dst, wiki_corpus.vocab, cfg).manifest


@pytest.fixture
def run_job(log_dir):
    jobs: list[Job] = []

    def start(consumer, **kwargs) -> Job:
        job = Job(consumer, log_dir, **kwargs)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.close()
