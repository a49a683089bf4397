"""benchmarks/text_peers.py and its loop (benchmarks/peers/text_loop.py): the pure helpers behind the
per-core table: grouping, CPU accounting, medians, ratios and the error line a failed peer shows."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.peers.text_loop import chunks, cpu_seconds, measured, next_fit, pieces
from benchmarks.text_peers import FIELD, ONLINE, READ, goals, key, last_line, summarize, table


@given(st.lists(st.integers(), max_size=50), st.integers(1, 9))
def test_chunks_keep_every_item_in_order_in_lists_of_at_most_size(items, size):
    out = list(chunks(items, size))
    assert [x for batch in out for x in batch] == items
    assert all(0 < len(batch) <= size for batch in out)
    assert all(len(batch) == size for batch in out[:-1])


@given(st.lists(st.integers(0, 9), max_size=40), st.integers(1, 8))
def test_pieces_cut_a_document_into_at_most_width_tokens_losing_none(ids, width):
    out = pieces(ids, width)
    assert [t for p in out for t in p] == ids
    assert all(len(p) <= width for p in out)


@given(st.lists(st.integers(1, 10), max_size=40), st.integers(10, 20))
def test_next_fit_groups_in_order_and_never_overfills(lengths, width):
    groups = list(next_fit(lengths, width))
    assert [i for g in groups for i in g] == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= width for g in groups)
    for g, following in zip(groups, groups[1:], strict=False):  # a group closed only when the next did not fit
        assert sum(lengths[i] for i in g) + lengths[following[0]] > width


def test_cpu_seconds_count_a_reaped_child_not_only_this_process():
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", "x = 0\nfor i in range(3_000_000): x += i"], check=True)
    assert cpu_seconds() - before > 0.05


def test_measured_divides_tokens_by_the_cpu_the_work_took():
    def work():
        total = sum(i * i for i in range(300_000))
        return 1000, total % 2

    out = measured(work)
    assert out["tokens"] == 1000 and out["cpu_s"] > 0
    assert abs(out["tokens_per_cpu_s"] - 1000 / out["cpu_s"]) < 1e-6


def test_last_line_is_the_error_a_failed_peer_printed():
    assert last_line("Traceback\n  File x\nImportError: no module grain\n\n") == "ImportError: no module grain"
    assert last_line("") == "(no output)"


def _run(rate):
    return {"tokens_per_cpu_s": rate, "tokens": 10, "rows": 1, "wall_s": 1.0, "versions": {}}


def test_summary_takes_medians_and_a_peer_that_failed_shows_its_line_in_the_table():
    rates = {key(c): [_run(r) for r in (300.0, 100.0, 200.0)] for c in FIELD}
    by_kind = {c: i for i, c in enumerate(FIELD)}
    for c, i in by_kind.items():  # each contender its own rate: Stoker's first online and reading best
        rates[key(c)] = [_run((1000.0 if not c.peer else 100.0) + i) for _ in range(3)]
    failed = next(c for c in FIELD if c.peer and c.kind == READ)
    rates[key(failed)] = [{"error": "ResolutionImpossible: transformers<5"}]
    summary = summarize(rates)
    assert summarize({"a": [_run(3.0), _run(1.0), _run(2.0)]})["a"]["tokens_per_cpu_s"] == 2.0
    assert summary[key(failed)] == {"error": "ResolutionImpossible: transformers<5"}
    ratios = goals(summary, FIELD)
    best_online_peer = max(100.0 + i for c, i in by_kind.items() if c.peer and c.kind == ONLINE)
    best_online_ours = max(1000.0 + i for c, i in by_kind.items() if not c.peer and c.kind == ONLINE)
    assert abs(ratios[ONLINE] - best_online_ours / best_online_peer) < 1e-9
    shown = table(2048, summary, FIELD)
    assert "did not run: ResolutionImpossible: transformers<5" in shown
    assert f"| {best_online_peer:,.0f} | 1.00 |" in shown
