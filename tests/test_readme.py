"""What the README and the pages under docs/ show is what runs, and nothing the code offers is left out.

The README's data-parallel script is examples/train_ddp.py, word for word: the tests run that file
(tests/integration/test_multinode.py, as the README's commands say), so the README shows what runs.
The transform example in docs/transforms.md works as a worker runs it. Every metric the code
registers has its row in docs/metrics.md, and every subcommand is in docs/commands.md. The README's
and the pages' relative links land on a file that exists and on a heading it has, under GitHub's
anchors and MkDocs' alike (`mkdocs build --strict` in `make test` checks the pages as the site
builds them; the README is not part of the site, so this is its check)."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_shows_the_example_the_tests_run():
    example = (ROOT / "examples" / "train_ddp.py").read_text().rstrip("\n")
    assert f"```python\n{example}\n```" in (ROOT / "README.md").read_text()


def test_the_documented_transform_runs_as_a_worker_runs_it(tmp_path, monkeypatch):
    """The example under "Your own transform" (docs/transforms.md) is code that works: resolved by
    its import path with parameters, run through the worker's HostTransform, the same pixels for the
    same seed."""
    import numpy as np
    from PIL import Image

    from stoker.pipeline.images.batching import HostTransform
    from stoker.pipeline.seeds import sample_random
    from stoker.pipeline.transforms import Sample, resolve

    page = (DOCS / "transforms.md").read_text()
    start = page.index('```python\n"""my_augment.py') + len("```python\n")
    (tmp_path / "my_augment.py").write_text(page[start:page.index("```", start)])
    monkeypatch.syspath_prepend(str(tmp_path))
    resolved = resolve("my_augment:Brighter", '{"size":64}')
    assert resolved.outputs["image"].shape == (64, 64, 3)
    jpeg = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 400, 3), dtype=np.uint8)).save(jpeg, "JPEG")
    work = HostTransform(resolved.transform, name="my_augment:Brighter")
    sample = Sample(3, "k", 0, jpeg.getvalue())
    first = work.prepare(sample, sample_random(0, 0, 3)).payload["image"]
    assert first.shape == (64, 64, 3) and first.dtype == np.uint8
    assert np.array_equal(first, work.prepare(sample, sample_random(0, 0, 3)).payload["image"])


def _registered_metrics() -> set[str]:
    """Every metric name as Prometheus exposes it, read from the calls to prometheus_client's types."""
    exposed = set()
    for path in sorted((ROOT / "stoker").rglob("*.py")):  # the product: stoker/ and its rooms
        tree = ast.parse(path.read_text(), str(path))
        local = {alias.asname or alias.name: alias.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
                 for alias in node.names if alias.name in METRIC_TYPES}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in local):
                continue
            name = node.args[0] if node.args else next(k.value for k in node.keywords if k.arg == "name")
            assert isinstance(name, ast.Constant), f"{path}:{node.lineno}: a metric named by an expression"
            kind, base = local[node.func.id], name.value.removesuffix("_total")
            exposed.add({"Counter": f"{base}_total", "Info": f"{base}_info"}.get(kind, name.value))
    return exposed


def test_every_registered_metric_has_its_row_in_the_metrics_page():
    metrics = _registered_metrics()
    assert len(metrics) > 50, f"found only {sorted(metrics)}: has the scan lost the metric modules?"
    page = (DOCS / "metrics.md").read_text()
    undocumented = {m for m in metrics if not re.search(rf"`{re.escape(m)}(\{{[\w,]*\}})?`", page)}
    assert not undocumented, f"not in docs/metrics.md: {sorted(undocumented)}"


def _help(argv: list[str], monkeypatch) -> str:
    from stoker.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([*argv, "--help"])
    return out.getvalue()


def _subcommands(argv: list[str], monkeypatch) -> list[tuple[str, ...]]:
    """Every command path under `stoker ARGV`, read from the help's `{a,b,c}` line of subcommands."""
    lines = [line.strip() for line in _help(argv, monkeypatch).splitlines()]
    names = next((line[1:-1].split(",") for line in lines if re.fullmatch(r"\{[\w,-]+\}", line)), [])
    found = []
    for name in names:
        found.append((*argv, name))
        found += _subcommands([*argv, name], monkeypatch)
    return found


def test_every_subcommand_is_in_the_commands_page(monkeypatch):
    commands = _subcommands([], monkeypatch)
    assert {("run",), ("worker",), ("lab", "cut"), ("prepare", "arrow")} <= set(commands)
    page = re.sub(r"\s+", " ", (DOCS / "commands.md").read_text())
    undocumented = [" ".join(c) for c in commands if not re.search(rf"\bstoker {re.escape(' '.join(c))}\b", page)]
    assert not undocumented, f"not in docs/commands.md as `stoker COMMAND`: {undocumented}"


def _heading_text(line: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
    return text.replace("`", "").replace("**", "").replace("*", "")


def _github_anchor(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _mkdocs_anchor(text: str) -> str:
    """Python-Markdown's toc slug, which MkDocs uses."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())


def _headings(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return [_heading_text(line) for line in text.splitlines() if re.match(r"#{1,6} ", line)]


def _broken_links(page: Path) -> list[str]:
    broken = []
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z+.-]*:", target):  # a URL: not fetched here
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.is_file():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if anchor:
            headings = _headings(dest)
            github = {_github_anchor(h) for h in headings}
            mkdocs = {_mkdocs_anchor(h) for h in headings}
            if anchor not in github or anchor not in mkdocs:
                broken.append(f"{target}: no heading with this anchor on GitHub {anchor in github}, "
                              f"in MkDocs {anchor in mkdocs}")
    return broken


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md"))])
def test_relative_links_land_on_a_file_and_heading_that_exist(page):
    broken = _broken_links(ROOT / page)
    assert not broken, f"{page}: {broken}"


def test_the_readme_links_to_every_page_of_the_docs():
    targets = LINK.findall((ROOT / "README.md").read_text())
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in targets if ":" not in target}
    unlinked = {p.relative_to(ROOT).as_posix() for p in DOCS.glob("*.md") if p.resolve() not in linked}
    assert not unlinked, f"pages the README's table of documentation leaves out: {sorted(unlinked)}"
