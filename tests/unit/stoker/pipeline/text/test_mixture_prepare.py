"""stoker/pipeline/text/mixture_prepare.py: `stoker prepare mixture`, token sets and weights into one checked
mixture manifest; settings that cannot hold refused in one line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from stoker.pipeline.store.shards import Manifest
from stoker.pipeline.text.mixture import MIXTURE, MixtureError, Schedule
from stoker.pipeline.text.mixture_prepare import SourceSpec, prepare_mixture
from stoker.pipeline.text.token_shards import lengths_of, read_token_shard
from tests.token_corpus import prepared, two_sources


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return two_sources(tmp_path_factory.mktemp("parts"))


def _specs(parts, web: float = 0.7, books: float = 0.3) -> list[SourceSpec]:
    return [SourceSpec("web", str(parts["web"]), web), SourceSpec("books", str(parts["books"]), books)]


def test_the_mixture_lists_every_sources_shards_once_with_their_sha256_and_every_documents_tokens(parts, tmp_path):
    result = prepare_mixture(_specs(parts), tmp_path / "mix", budget=8000)
    mixed = Manifest.load(result.manifest.uri)
    originals = [Manifest.load(parts[name]) for name in ("web", "books")]
    assert mixed.num_samples == sum(m.num_samples for m in originals)
    assert [s.sha256 for s in mixed.shards] == [s.sha256 for m in originals for s in m.shards]
    counts = [s.num_samples for s in mixed.shards]
    assert [s.first_sample_id for s in mixed.shards] == list(np.cumsum([0] + counts)[:-1])
    lengths = lengths_of(mixed)
    for index, info in enumerate(mixed.shards):
        shard = read_token_shard(mixed.shard_uri(index), info, mixed.tokens["vocab_size"])
        got = lengths[info.first_sample_id: info.first_sample_id + info.num_samples]
        assert got.tolist() == np.diff(shard.offsets).tolist()
    mix = mixed.tokens[MIXTURE]
    assert [s["name"] for s in mix["sources"]] == ["web", "books"] and mix["budget"] == 8000
    assert mixed.tokens["fingerprint"] == originals[0].tokens["fingerprint"]
    assert result.tokens == {"web": originals[0].tokens["total"], "books": originals[1].tokens["total"]}
    assert Schedule.of(mixed, 8).rows(0, 0) > 0


def test_a_source_of_another_tokenizer_is_refused(parts, tmp_path):
    other, _, _ = prepared(tmp_path / "other", count=30)
    specs = [SourceSpec("web", str(parts["web"]), 1.0), SourceSpec("other", other.manifest.uri, 1.0)]
    with pytest.raises(MixtureError, match="source other: its tokenizer's fingerprint .* a mixture has one tokenizer"):
        prepare_mixture(specs, tmp_path / "mix", budget=10**6)


def test_an_epoch_rule_that_runs_out_too_soon_for_one_percent_is_refused(parts, tmp_path):
    with pytest.raises(MixtureError, match="too small for source .* give --budget"):
        prepare_mixture(_specs(parts), tmp_path / "mix", budget=100)


def _prepare(*args: str):
    return subprocess.run([sys.executable, "-m", "stoker", "prepare", "mixture", *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("flags", "says"), [
    (["--source", "web={web}:-1", "--source", "books={books}:1", "--budget", "9000"], "must be a positive number"),
    (["--source", "web={web}", "--budget", "9000"], "is not NAME=DIR/manifest.json:WEIGHT"),
    (["--source", "web={web}:1", "--source", "web={books}:1", "--budget", "9000"], "web given more than once"),
    (["--source", "web={web}:1", "--source", "books={books}:1", "--pass", "nope"], "--pass nope: not one of"),
    (["--source", "web={web}:1", "--budget", "0"], "argument --budget"),
    (["--source", "web={web}:1"], "one of the arguments --budget --pass is required"),
    (["--source", "web={web}:1", "--source", "books={books}:1", "--budget", "50"], "too small for source"),
])
def test_settings_that_cannot_hold_are_refused_in_one_line(parts, tmp_path, flags, says):
    run = _prepare(*[f.format(**parts) for f in flags], "--out", str(tmp_path / "mix"))
    assert run.returncode == 2 and says in run.stderr, run.stderr
    assert len([line for line in run.stderr.splitlines() if "error" in line]) == 1


def test_the_command_writes_a_mixture_and_says_its_epoch(parts, tmp_path):
    run = _prepare("--source", f"web={parts['web']}:0.7", "--source", f"books={parts['books']}/manifest.json:0.3",
                   "--pass", "web", "--out", str(tmp_path / "mix"))
    assert run.returncode == 0, run.stderr
    assert "wrote a mixture of web 0.7" in run.stdout and "repeat when a source runs out" in run.stdout
    assert Manifest.load(tmp_path / "mix").tokens[MIXTURE]["pass"] == "web"
