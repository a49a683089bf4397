"""stoker/accel/control/failures.py: a job's failure line stays whole for people; its metric label is one of
a closed set of kinds, whatever words the line (or a peer that sent it) holds."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from stoker.accel.control.failures import (
    DISPATCHER_GONE,
    FAILURE_KINDS,
    OTHER,
    REFUSED,
    STALLED,
    dispatcher_gone_line,
    failed_line,
    failure_kind,
    refused_line,
    stalled_line,
)
from stoker.accel.control.metrics import ControlMetrics


def test_every_line_the_product_makes_counts_under_its_own_kind_and_every_kind_is_in_the_set():
    made = {REFUSED: refused_line("h3", "transform 'augs.ta:Wide' is augs 2.0 here, the job runs augs 1.9"),
            STALLED: stalled_line(310.4, 300, "rank 0 has waited 310 s for its next batch: unit 7 held by h0/p1"),
            DISPATCHER_GONE: dispatcher_gone_line("tcp://10.0.0.1:5561", 301.2, 300)}
    assert {kind: failure_kind(line) for kind, line in made.items()} == {kind: kind for kind in made}
    assert set(made) | {OTHER} == set(FAILURE_KINDS)
    odd = refused_line("h\u00e9\u0663 x", "line\u2028two \U0001f525 999999")  # a peer's host id and words, any text
    assert failure_kind(odd) == REFUSED


@pytest.mark.parametrize("line", [
    "", "other", "refused", "host h0 did not refuse", "no batch for ever",
    "no batch for \u0663\u0663 s (--stall-timeout 3): x", "the dispatcher at  has not answered", "12345",
    "\u30b8\u30e7\u30d6\u5931\u6557", "a made-up reason from a peer " * 40, "\nhost h0 refused the job: x",
    " no batch for 3 s (--stall-timeout 3): x"])
def test_any_other_text_counts_as_other_never_as_a_label_of_its_own(line):
    assert failure_kind(line) == OTHER


def test_the_gauge_carries_the_kind_never_the_line():
    metrics = ControlMetrics(CollectorRegistry())
    for line in (refused_line("h0", "no module named augs"), refused_line("h1", "another reason"),
                 "digits 0123456789 and \u00fcnicode", "a peer's own words"):
        metrics.job_failed(line)
    labels = {s.labels["reason"] for s in metrics.registry.collect() if s.name == "stoker_job_failed"
              for s in s.samples}
    assert labels == {REFUSED, OTHER} and labels <= set(FAILURE_KINDS)


def test_status_says_the_kind_in_words_and_shows_an_unknown_one_as_it_is():
    assert failed_line(REFUSED).startswith("the job failed: a worker host refused the job (")
    assert failed_line("from an older stoker").startswith("the job failed: from an older stoker (")
