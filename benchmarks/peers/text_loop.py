"""One contender of `python -m benchmarks text_peers`: a corpus to causal-LM rows, in whichever
environment has its library (Stoker's for `stoker_*`, benchmarks/work/text-peer-venv for datasets,
Grain and litdata, benchmarks/work/mosaic-venv for MosaicML Streaming), on the core it is pinned to.

`python text_loop.py CONTENDER --seq-len N ...` does the untimed setup (imports, loading the
tokenizer), then times the contender from reading its input to its last row, and prints one JSON
line: tokens delivered (input positions holding a token, end-of-text included, padding not),
rows, the CPU seconds of this process and of its reaped children over that span
(getrusage(RUSAGE_SELF) + getrusage(RUSAGE_CHILDREN), user + system: every thread of the
process counts, as on a host's cores), the wall seconds, and the library's versions.
`prepare_mds` / `prepare_litdata` write a store once, untimed. Heavy imports happen inside each
contender, so the pure helpers here import with the standard library and numpy alone.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator

import numpy as np

CHUNK = 256  # documents tokenized (and, online, packed) together: tokenize_cost's batch
READ_BATCH = 1024  # documents per Parquet read batch, Stoker's own default batch of rows


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (every thread) and of its reaped children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def chunks(items: Iterable, size: int) -> Iterator[list]:
    """`items` in lists of `size` (the last one shorter, none empty)."""
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def pieces(ids: list[int], width: int) -> list[list[int]]:
    """A document cut into pieces of at most `width` tokens, as packing needs (none lost)."""
    return [ids[i:i + width] for i in range(0, len(ids), width)] or [ids]


def next_fit(lengths: Iterable[int], width: int) -> Iterator[list[int]]:
    """Indices grouped in order into groups of total length <= width (a group closes when the next
    does not fit): the packing a user writes around DataCollatorWithFlattening."""
    group: list[int] = []
    room = width
    for index, length in enumerate(lengths):
        if group and length > room:
            yield group
            group, room = [], width
        group.append(index)
        room -= length
    if group:
        yield group


def measured(work: Callable[[], tuple[int, int]]) -> dict:
    """Run `work` (-> tokens, rows) and say what it cost."""
    cpu, wall = cpu_seconds(), time.perf_counter()
    tokens, rows = work()
    cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
    return {"tokens": tokens, "rows": rows, "cpu_s": cpu, "wall_s": wall,
            "tokens_per_cpu_s": tokens / cpu if cpu > 0 else 0.0}


def repeated(one_pass: Callable[[], tuple[int, int]], passes: int) -> Callable[[], tuple[int, int]]:
    """`passes` passes over a store, each opening it anew: a pass of a reader can be too short to time."""
    def work() -> tuple[int, int]:
        tokens = rows = 0
        for _ in range(passes):
            more, more_rows = one_pass()
            tokens, rows = tokens + more, rows + more_rows
        return tokens, rows

    return work


def versions(*names: str) -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in names}


def _texts(jsonl: str) -> Iterator[str]:
    with open(jsonl, encoding="utf-8") as lines:
        for line in lines:
            yield json.loads(line)["text"]


def _rust_tokenizer(path: str):  # noqa: ANN202 - tokenizers.Tokenizer, imported here only
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.no_truncation()  # the saved tokenizer.json truncates and pads to 128; documents are tokenized whole
    tok.no_padding()
    return tok


# --- Stoker (its own environment) ---------------------------------------------------------------

def stoker_online(args: argparse.Namespace) -> tuple[Callable[[], tuple[int, int]], dict]:
    from stoker.pipeline.text.causal import CausalConfig, causal_rows
    from stoker.pipeline.text.sources import TextSource
    from stoker.pipeline.text.tokenizer import TokenizerConfig

    tok = TokenizerConfig(path=args.tokenizer).load()
    config = CausalConfig(seq_len=args.seq_len, eot=tok.eot_id, pad=tok.pad_id, mode=args.mode)

    def work() -> tuple[int, int]:
        tokens = rows = 0
        for batch in chunks((doc.text for doc in TextSource(args.input).documents()), CHUNK):
            out = causal_rows(tok.encode_batch(batch), config)
            tokens, rows = tokens + out.stats.tokens, rows + out.stats.rows
        return tokens, rows

    return work, versions("tokenizers", "numpy", "pyarrow")


def stoker_read(args: argparse.Namespace) -> tuple[Callable[[], tuple[int, int]], dict]:
    """A token set `stoker prepare tokens` wrote, read as a worker reads it: every unit of epoch 0 through
    the worker's TokenSource (read_token_shard: the shard's sha256, Parquet decode, every document checked;
    lm_layout.unit_token_batches: the unit's documents in its seeded order as causal-LM rows and batches,
    each batch's header made). Each pass is a new TokenSource, so every shard is read again."""
    from stoker.pipeline.job import JobConfig
    from stoker.pipeline.store.shards import Manifest
    from stoker.pipeline.text.lm_layout import LMConfig
    from stoker.workers.sources import TokenSource

    manifest = Manifest.load(args.input)
    job = JobConfig(manifest_uri=args.input, dataset="tokens", batch_size=args.batch_size,
                    lm=LMConfig(seq_len=args.seq_len, mode=args.mode))
    units = job.plan(manifest).units(0)
    next(TokenSource(manifest, job).batches(units[0]))  # untimed: pyarrow's and numpy's lazy imports

    def one_pass() -> tuple[int, int]:
        source = TokenSource(manifest, job)
        tokens = rows = 0
        for unit in units:
            for out in source.batches(unit):
                tokens, rows = tokens + out.header.text.real_tokens, rows + out.header.rows
        return tokens, rows

    return repeated(one_pass, args.passes), versions("numpy", "pyarrow")


# --- Hugging Face datasets (+ transformers' collator) --------------------------------------------

def hf_datasets(args: argparse.Namespace) -> tuple[Callable[[], tuple[int, int]], dict]:
    """Dataset.from_json -> map(tokenize, batched=True) -> concat: the documented group_texts map;
    packed: documents cut to seq_len, grouped in order, DataCollatorWithFlattening per row. A fresh
    cache folder each run, so nothing is served from an earlier run's Arrow files."""
    from datasets import Dataset, disable_progress_bars
    from transformers import DataCollatorWithFlattening, PreTrainedTokenizerFast

    disable_progress_bars()
    tok = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer)
    width, eot = args.seq_len, args.eot

    def tokenize(batch: dict) -> dict:
        ids = tok(batch["text"], add_special_tokens=False, return_attention_mask=False,
                  return_token_type_ids=False)["input_ids"]
        return {"input_ids": [x + [eot] for x in ids]}

    def group_texts(batch: dict) -> dict:  # transformers' run_clm.py recipe
        stream = [t for ids in batch["input_ids"] for t in ids]
        total = len(stream) // width * width
        blocks = [stream[i:i + width] for i in range(0, total, width)]
        return {"input_ids": blocks, "labels": [b.copy() for b in blocks]}

    def work() -> tuple[int, int]:
        with tempfile.TemporaryDirectory() as cache:
            ds = Dataset.from_json(args.input, cache_dir=cache)
            ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names)
            if args.mode == "concat":
                ds = ds.map(group_texts, batched=True).with_format("numpy")
                tokens = rows = 0
                for batch in ds.iter(batch_size=8):
                    tokens, rows = tokens + batch["input_ids"].size, rows + len(batch["input_ids"])
                return tokens, rows
            collator = DataCollatorWithFlattening(return_tensors="np")
            tokens = rows = 0
            for batch in ds.iter(batch_size=1000):
                docs = [p for ids in batch["input_ids"] for p in pieces(ids, width)]
                for group in next_fit((len(d) for d in docs), width):
                    out = collator([{"input_ids": docs[i]} for i in group])
                    tokens, rows = tokens + out["input_ids"].size, rows + 1
            return tokens, rows

    return work, versions("datasets", "transformers", "tokenizers", "pyarrow", "numpy")


# --- Grain ---------------------------------------------------------------------------------------

def grain_pack(args: argparse.Namespace, best: bool = False) -> tuple[Callable[[], tuple[int, int]], dict]:
    """JSONL lines -> the Rust batch encoder (CHUNK documents a call, as Stoker's) -> Grain:
    FirstFitPackIterDataset or BestFitPackIterDataset (packed, `bins` rows open, in order) or
    ConcatThenSplitIterDataset (concat) into rows of seq_len."""
    import grain
    from grain import experimental as gx

    tok = _rust_tokenizer(args.tokenizer)
    width, eot = args.seq_len, args.eot

    def tokenized() -> Iterator[dict]:
        for batch in chunks(_texts(args.input), CHUNK):
            for enc in tok.encode_batch_fast(batch, add_special_tokens=False):
                ids = np.array([*enc.ids, eot], dtype=np.int32)
                for start in range(0, ids.size, width):
                    yield {"inputs": ids[start:start + width]}

    def work() -> tuple[int, int]:
        ds = grain.MapDataset.source(list(tokenized())).to_iter_dataset()
        if args.mode == "concat":
            ds = gx.ConcatThenSplitIterDataset(ds, length_struct={"inputs": width})
        else:
            packer = gx.BestFitPackIterDataset if best else gx.FirstFitPackIterDataset
            ds = packer(ds, length_struct={"inputs": width}, num_packing_bins=args.bins, shuffle_bins=False)
        tokens = rows = 0
        for row in ds:
            mask = row["inputs_segment_ids"] > 0 if "inputs_segment_ids" in row else np.ones(width, bool)
            tokens, rows = tokens + int(mask.sum()), rows + 1
        return tokens, rows

    return work, versions("grain", "tokenizers", "numpy")


# --- pre-tokenized stores: MosaicML Streaming and litdata ----------------------------------------

def _stream(tokens_npz: str) -> tuple[np.ndarray, np.ndarray]:
    data = np.load(tokens_npz)
    return data["flat"], data["offsets"]


def prepare_mds(args: argparse.Namespace) -> None:
    """The documents' stream (each followed by end-of-text) cut into samples of seq_len tokens, as
    llm-foundry's convert_dataset_hf --concat_tokens writes them."""
    from streaming import MDSWriter

    flat, offsets = _stream(args.input)
    stream = np.insert(flat, offsets[1:], args.eot).astype(np.int32)
    with MDSWriter(out=args.output, columns={"tokens": "ndarray:int32"}, size_limit="64mb") as out:
        for start in range(0, stream.size - args.seq_len + 1, args.seq_len):
            out.write({"tokens": stream[start:start + args.seq_len]})


def mosaic_read(args: argparse.Namespace) -> tuple[Callable[[], tuple[int, int]], dict]:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    def one_pass() -> tuple[int, int]:
        ds = StreamingDataset(local=args.input, shuffle=False, batch_size=8)
        tokens = rows = 0
        for sample in ds:
            tokens, rows = tokens + sample["tokens"].size, rows + 1
        return tokens, rows

    return repeated(one_pass, args.passes), versions("mosaicml-streaming", "torch", "numpy")


def prepare_litdata(args: argparse.Namespace) -> None:
    """Each document's tokens and end-of-text as one item, litdata's recipe for LLM pretraining."""
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    flat, offsets = _stream(args.input)
    item = functools.partial(_litdata_item, flat, offsets, args.eot)  # picklable: optimize's workers
    optimize(fn=item, inputs=list(range(len(offsets) - 1)), output_dir=args.output, chunk_bytes="64MB",
             item_loader=TokensLoader(), num_workers=1, mode="overwrite")


def _litdata_item(flat: np.ndarray, offsets: np.ndarray, eot: int, index: int) -> object:
    import torch

    return torch.from_numpy(np.append(flat[offsets[index]:offsets[index + 1]], eot).astype(np.int32))


def litdata_read(args: argparse.Namespace) -> tuple[Callable[[], tuple[int, int]], dict]:
    from litdata import StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    def one_pass() -> tuple[int, int]:
        ds = StreamingDataset(input_dir=args.input, item_loader=TokensLoader(block_size=args.seq_len), shuffle=False)
        tokens = rows = 0
        for block in ds:
            tokens, rows = tokens + block.numel(), rows + 1
        return tokens, rows

    return repeated(one_pass, args.passes), versions("litdata", "torch", "numpy")


CONTENDERS = {"stoker_online": stoker_online, "stoker_read": stoker_read, "hf_datasets": hf_datasets,
              "grain": grain_pack, "grain_best": lambda args: grain_pack(args, best=True),
              "mosaic_read": mosaic_read, "litdata_read": litdata_read}
PREPARERS = {"prepare_mds": prepare_mds, "prepare_litdata": prepare_litdata}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("contender", choices=[*CONTENDERS, *PREPARERS])
    parser.add_argument("--input", required=True, help="JSONL corpus, Parquet/npz of tokens, or a store folder")
    parser.add_argument("--output", default="")
    parser.add_argument("--tokenizer", default="")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--mode", choices=("concat", "packed"), default="packed")
    parser.add_argument("--eot", type=int, default=0)
    parser.add_argument("--pad", type=int, default=0)
    parser.add_argument("--passes", type=int, default=1, help="readers: passes over the store, timed together")
    parser.add_argument("--bins", type=int, default=16, help="Grain's num_packing_bins")
    parser.add_argument("--batch-size", type=int, default=64, help="stoker_read: the job's --batch-size "
                        "(JobConfig's default; a unit holds 4 batches' worth of documents)")
    args = parser.parse_args(argv)
    if args.contender in PREPARERS:
        PREPARERS[args.contender](args)
        return
    work, found = CONTENDERS[args.contender](args)
    print(json.dumps({**measured(work), "versions": found, "python": sys.version.split()[0]}), flush=True)


if __name__ == "__main__":
    main()
