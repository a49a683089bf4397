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


@pytest.mark.parametrize("out", ["{web}", "{web}/", "{web}/inner", "{top}"])
def test_an_out_that_is_inside_or_holds_a_sources_folder_is_refused_before_anything_is_written(tmp_path, out):
    parts = two_sources(tmp_path / "parts", sizes=(40, 20))
    before = {p: p.read_bytes() for p in (tmp_path / "parts").rglob("*") if p.is_file()}
    target = out.format(web=parts["web"], top=tmp_path / "parts")
    run = _prepare("--source", f"web={parts['web']}/manifest.json:0.5", "--source", f"books={parts['books']}:0.5",
                   "--budget", "10000000", "--out", target)
    assert run.returncode == 2 and "source web's folder" in run.stderr and "apart from every source's" in run.stderr
    assert len([line for line in run.stderr.splitlines() if "error" in line]) == 1, run.stderr
    after = {p: p.read_bytes() for p in (tmp_path / "parts").rglob("*") if p.is_file()}
    assert after == before  # the sources are as they were: not a file written, changed or removed
    assert Manifest.load(parts["web"]).tokens.get(MIXTURE) is None


def test_an_online_set_is_refused_as_a_source_in_one_line(parts, tmp_path):
    """A mixture reads token shards: an online set (text the workers tokenize) is refused, naming why."""
    from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
    from tests.token_corpus import jsonl, texts

    tok = parts["web"] / "tokenizer.json"
    online = prepare_tokens(jsonl(tmp_path / "c.jsonl", texts(20, seed=5), bad=False), tmp_path / "online", str(tok),
                            TokenPrepareConfig(progress=False, online=True))
    specs = [SourceSpec("web", str(parts["web"]), 0.5), SourceSpec("talk", online.manifest.uri, 0.5)]
    with pytest.raises(MixtureError, match="source talk: .* is an online set .* prepare it without --online") as err:
        prepare_mixture(specs, tmp_path / "mix", budget=4000)
    assert "\n" not in str(err.value) and not (tmp_path / "mix").exists()


def _bytes_under(folder) -> dict:
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _every_shard_matches_its_manifest(folder) -> None:
    import hashlib

    manifest = Manifest.load(folder)
    for index, info in enumerate(manifest.shards):
        with open(manifest.shard_uri(index), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == info.sha256, manifest.shard_uri(index)
    assert lengths_of(manifest).shape == (manifest.num_samples,)


def test_a_mixture_rerun_into_its_folder_from_another_source_never_writes_through_a_link_to_the_first(tmp_path):
    """The mixture links its sources' shards: a rerun into the same --out replaces its names, never the bytes
    they shared with the first source."""
    parts = two_sources(tmp_path / "parts", sizes=(60, 40))
    before = _bytes_under(parts["web"])
    for source in ("web", "books"):
        run = _prepare("--source", f"x={parts[source]}:1", "--budget", "10000000", "--out", str(tmp_path / "mix"))
        assert run.returncode == 0, run.stderr
    assert _bytes_under(parts["web"]) == before
    _every_shard_matches_its_manifest(parts["web"])
    _every_shard_matches_its_manifest(tmp_path / "mix")


def test_preparing_tokens_again_into_a_sources_folder_leaves_a_mixture_of_it_as_it_was(tmp_path):
    """`prepare tokens B --out A` replaces A's files by name: a mixture that linked A's shards keeps A's bytes."""
    parts = two_sources(tmp_path / "parts", sizes=(60, 40))
    run = _prepare("--source", f"x={parts['web']}:1", "--budget", "10000000", "--out", str(tmp_path / "mix"))
    assert run.returncode == 0, run.stderr
    before = _bytes_under(tmp_path / "mix")
    run = subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(tmp_path / "parts" / "books.jsonl"),
                          "--tokenizer", str(tmp_path / "parts" / "tokenizer-src.json"), "--out", str(parts["web"]),
                          ], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert _bytes_under(tmp_path / "mix") == before
    _every_shard_matches_its_manifest(tmp_path / "mix")
    _every_shard_matches_its_manifest(parts["web"])
