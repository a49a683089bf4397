"""stoker/pipeline/seeds.py: every random draw depends on (seed, epoch, key) alone, in any process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from stoker.pipeline.seeds import ReseededRng, derived_rng, key_hash, sample_random

ROOT = Path(__file__).resolve().parents[4]


def test_a_key_hash_is_the_same_in_another_process_with_another_hash_seed():
    here = key_hash("n01440764/img_7.JPEG")
    there = subprocess.run([sys.executable, "-c", "from stoker.pipeline.seeds import key_hash; "
                            "print(key_hash('n01440764/img_7.JPEG'))"], cwd=ROOT, capture_output=True, text=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert there.returncode == 0, there.stderr
    assert int(there.stdout) == here and 0 <= here < 2**64
    assert key_hash(b"n01440764/img_7.JPEG") == here and key_hash("other") != here


def test_derived_generators_repeat_for_the_same_triple_and_differ_otherwise():
    draws = derived_rng(7, 1, "key").integers(0, 2**32, 8)
    assert np.array_equal(derived_rng(7, 1, "key").integers(0, 2**32, 8), draws)
    for other in (derived_rng(8, 1, "key"), derived_rng(7, 2, "key"), derived_rng(7, 1, "kex"),
                  derived_rng(7, 1, 3)):
        assert not np.array_equal(other.integers(0, 2**32, 8), draws)
    assert np.array_equal(derived_rng(7, 1, key_hash("key")).integers(0, 2**32, 8), draws)  # an int key is the hash


def test_a_reseeded_generator_depends_on_its_key_not_on_what_it_drew_before():
    rng = ReseededRng()
    first = rng.reseed(3, 0, "doc-1").integers(0, 2**32, 8)
    rng.reseed(3, 0, "doc-2").integers(0, 2**32, 100)  # another document in between
    again = rng.reseed(3, 0, b"doc-1")
    assert np.array_equal(again.integers(0, 2**32, 8), first)
    assert again is rng.reseed(3, 1, "doc-1")  # one generator, reused
    assert not np.array_equal(again.integers(0, 2**32, 8), first)  # epoch 1 draws differently
    assert np.array_equal(ReseededRng().reseed(3, 0, "doc-1").integers(0, 2**32, 8), first)


def test_per_sample_generators_repeat_and_differ_by_sample_epoch_and_seed():
    draws = [sample_random(1, 0, 42).random() for _ in range(2)]
    assert draws[0] == draws[1]
    others = {sample_random(1, 0, 43).random(), sample_random(1, 1, 42).random(), sample_random(2, 0, 42).random()}
    assert draws[0] not in others and len(others) == 3
