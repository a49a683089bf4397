"""Local shards that do not match their manifest, through real worker daemons and a consumer.

A shard with fewer rows than its manifest says, or whose bytes were changed (flipped bytes,
edited labels), has its samples skipped and counted with a reason that names it, once; the
worker process does not crash (no restart loop), the job finishes in seconds, and every sample
that trains has the pixels and label a valid shard gives it.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from stoker.pipeline.store.shards import Manifest
from tests.helpers import assert_exactly_once, run_recorded
from tests.shard_edits import ROWS, flip_inside_a_jpeg, rows_of, write_shard

VICTIM = 3


def _copy(manifest: Manifest, dst: Path) -> Path:
    shutil.copytree(Path(manifest.uri).parent, dst)
    return dst


def test_a_shard_with_fewer_rows_than_its_manifest_says_is_skipped_and_the_job_finishes(sixteen, expected, tmp_path,
                                                                                           log_dir):
    folder = _copy(sixteen, tmp_path / "short")
    info = sixteen.shards[VICTIM]
    rows = rows_of(Manifest.load(folder / "manifest.json"))[info.first_sample_id: info.first_sample_id + ROWS - 3]
    written = write_shard(folder / info.path, rows, info.first_sample_id)
    manifest = Manifest.load(folder / "manifest.json")
    manifest.shards[VICTIM].sha256, manifest.shards[VICTIM].num_bytes = written.sha256, written.num_bytes
    manifest.save(folder / "manifest.json")  # the bytes are as the manifest says; the row count is not
    started = time.monotonic()
    job, recorder, metrics = run_recorded(str(folder / "manifest.json"), log_dir)
    assert time.monotonic() - started < 30
    summary = job.summary
    assert_exactly_once(summary, sixteen.num_samples, 1, skipped_per_epoch=ROWS)
    victims = set(range(info.first_sample_id, info.first_sample_id + ROWS))
    assert {s["sample_id"] for s in summary.skipped} == victims
    assert {s["reason"] for s in summary.skipped} == {f"shard {info.path}: {ROWS - 3} rows, the manifest says {ROWS}"}
    assert "restart" not in job.logs() and "died" not in job.logs()
    assert metrics["stoker_worker_shards_refused_total{reason=rows}"] == 1
    assert metrics["stoker_worker_decode_errors_total"] == ROWS
    assert recorder.wrong(expected) == [] and len(recorder.trained) == sixteen.num_samples - ROWS


@pytest.mark.parametrize("damage", ["flipped bytes", "edited labels"])
def test_a_local_shard_whose_bytes_changed_is_skipped_not_trained(sixteen, expected, tmp_path, log_dir, damage):
    folder = _copy(sixteen, tmp_path / "changed")
    info = sixteen.shards[VICTIM]
    rows = rows_of(sixteen)[info.first_sample_id: info.first_sample_id + ROWS]
    if damage == "flipped bytes":
        flip_inside_a_jpeg(folder / info.path, rows[ROWS // 2][2])
    else:
        write_shard(folder / info.path, [(k, (label + 1) % 4, j, r) for k, label, j, r in rows], info.first_sample_id)
    job, recorder, metrics = run_recorded(str(folder / "manifest.json"), log_dir)
    summary = job.summary
    assert_exactly_once(summary, sixteen.num_samples, 1, skipped_per_epoch=ROWS)
    assert {s["sample_id"] for s in summary.skipped} == set(range(info.first_sample_id, info.first_sample_id + ROWS))
    assert all(s["reason"].startswith(f"shard {info.path}: its bytes have sha256 ") for s in summary.skipped)
    assert metrics["stoker_worker_shards_refused_total{reason=sha256}"] == 1
    assert recorder.wrong(expected) == [] and len(recorder.trained) == sixteen.num_samples - ROWS
