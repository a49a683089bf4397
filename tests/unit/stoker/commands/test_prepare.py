"""stoker/commands/prepare.py: `stoker prepare webdataset|parquet|imagenet` as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stoker.pipeline.store.shards import Manifest
from tests.packing import folder_samples, write_hf_parquet, write_tars

IMAGES = 12


def stoker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def packed(raw_images, tmp_path_factory):
    """IMAGES images as two WebDataset tars and as a Hugging Face Parquet split."""
    root = tmp_path_factory.mktemp("cli-packed")
    samples, classes = folder_samples(raw_images)
    write_tars(samples[:IMAGES], root / "tars", per_tar=IMAGES // 2)
    write_hf_parquet(samples[:IMAGES], root / "hf" / "data" / "train-00000-of-00001.parquet", classes)
    write_hf_parquet(samples[IMAGES:], root / "hf" / "data" / "test-00000-of-00001.parquet", classes)
    return root


def test_prepare_webdataset_tars_and_a_parquet_split(packed, tmp_path):
    for args in (["webdataset", f"{packed}/tars/shard-{{000000..000001}}.tar"],
                 ["parquet", f"{packed}/hf/data/train-*.parquet", "--batch-rows", "5"],
                 ["arrow", str(packed / "hf" / "data" / "train-00000-of-00001.parquet")]):
        dst = tmp_path / args[0]
        result = stoker("prepare", *args, str(dst), "--procs", "1")
        assert result.returncode == 0, result.stderr
        assert f"wrote {IMAGES} samples in 1 shard(s)" in result.stdout and "skipped 0 record(s); " in result.stdout
        manifest = Manifest.load(dst)
        assert manifest.num_samples == IMAGES and manifest.records == "jpeg" and manifest.transcoded > 0
        assert len(manifest.classes) == (4 if args[0] != "webdataset" else 1 + max(
            manifest.open_shard(0).label(r) for r in range(IMAGES)))


def test_records_bytes_from_the_command_line(tmp_path):
    write_tars([(f"k{i}", i, f"payload {i}".encode()) for i in range(5)], tmp_path / "tars", per_tar=5, ext="npy")
    result = stoker("prepare", "webdataset", str(tmp_path / "tars"), str(tmp_path / "dst"), "--records", "bytes",
                    "--data-ext", "npy", "--procs", "1")
    assert result.returncode == 0, result.stderr
    assert "wrote 5 samples in 1 shard(s), 5 classes" in result.stdout
    assert "stored as given (records: bytes, no JPEG checks)" in result.stdout
    reader = Manifest.load(tmp_path / "dst").open_shard(0)
    assert sorted(bytes(reader.jpeg(r)) for r in range(5)) == sorted(f"payload {i}".encode() for i in range(5))


@pytest.mark.parametrize("args, message", [
    (["parquet", "S", "D", "--label-field", "y"],
     "stoker prepare parquet: error: argument --label-field: is for `stoker prepare webdataset` (the field of a "
     "tar sample's .json that holds its label), not for parquet (see stoker prepare parquet --help)"),
    (["webdataset", "S", "D", "--image-column", "jpg"],
     "argument --image-column: is for `stoker prepare parquet` (a table's column of image bytes), not for webdataset"),
    (["imagenet", "S", "D", "--data-ext", "png"], "argument --data-ext: is for `stoker prepare webdataset`"),
    (["webdataset", "S", "D", "--data-ext", "jpg,,png"], "argument --data-ext: must be comma-separated extensions"),
    (["parquet", "S", "D", "--batch-rows", "0"], "argument --batch-rows: must be an integer >= 1, not '0'"),
    (["webdataset", "S", "D", "--records", "bytes", "--restart-interval-px", "32"],
     "stoker: error: prepare webdataset: argument --restart-interval-px: --records bytes stores records as given"),
    (["parquet", "S", "D", "--records", "png"], "argument --records: invalid choice: 'png'"),
])
def test_a_flag_that_cannot_work_is_refused_at_parse_time(tmp_path, args, message):
    result = stoker("prepare", *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_input_is_one_line_naming_the_file(packed, tmp_path):
    train = packed / "hf" / "data" / "train-00000-of-00001.parquet"
    (tmp_path / "fake.parquet").write_bytes(b"not parquet at all")
    (tmp_path / "fake.tar").write_bytes(b"not a tar at all" * 100)
    for args, message in [
        (["parquet", str(train), "--image-column", "img"],
         f"stoker: error: {train}: no column 'img' (its columns: image: struct<bytes: binary, path: string>, label: "
         "int64); name the right one with --image-column"),
        (["parquet", str(tmp_path / "fake.parquet")], "fake.parquet: neither a Parquet nor an Arrow IPC file"),
        (["webdataset", str(tmp_path / "fake.tar")], "fake.tar: not a tar file"),
        (["webdataset", str(tmp_path / "none-*.tar")], "no such file or folder, and no file matches it"),
        (["imagenet", str(packed / "tars")], "; for WebDataset tar shards use `stoker prepare webdataset`"),
    ]:
        result = stoker("prepare", *args, str(tmp_path / "dst"))
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_parquet_example_makes_a_set_that_prepares(tmp_path):
    """examples/parquet_dataset/README.md's first two commands."""
    example = Path(__file__).resolve().parents[4] / "examples" / "parquet_dataset" / "make_parquet.py"
    made = subprocess.run([sys.executable, str(example), str(tmp_path / "hf"), "--images", "24", "--classes", "3"],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (tmp_path / "hf" / "data").iterdir()) == \
        ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    result = stoker("prepare", "parquet", f"{tmp_path}/hf/data/train-*.parquet", str(tmp_path / "shards"),
                    "--procs", "1")
    assert result.returncode == 0, result.stderr
    manifest = Manifest.load(tmp_path / "shards")
    assert manifest.num_samples == 24 and manifest.classes == ["n01440764", "n01443537", "n01484850"]


@pytest.mark.parametrize(("given", "taken"), [("3", 3), ("0042", 42), ("<|endoftext|>", "<|endoftext|>"),
                                              ("\u0663", "\u0663"), ("\u00b3", "\u00b3"), ("\uff13", "\uff13")])
def test_eot_is_an_id_only_when_ascii_digits_else_a_tokens_text(given, taken):
    """Python's int() reads `٣` (Arabic-Indic three) or a full-width `３` as 3: those are tokens' texts, to be
    looked up in the vocabulary (and refused there when it lacks them), never silently id 3."""
    from stoker.commands.prepare import _special_token

    assert _special_token(given) == taken and type(_special_token(given)) is type(taken)
