"""The `torch` accelerator for token streams: a tiny GPT-style causal transformer stepped with AdamW.

The smallest honest model of a `tokens` job, so `stoker run --accel torch` trains on what the
workers deliver: token and learned position embeddings, pre-norm `nn.TransformerEncoderLayer`s
under a causal mask, a final norm and an output projection tied to the token embedding. The loss is
cross-entropy over `labels` (already the next token, -100 where nothing is predicted, so no shift).
A packed batch's `segment_ids` keep attention inside each document (a token sees the earlier tokens
of its own segment only) and its `position_ids` restart per document, so packing is invisible to
the model; a concat batch is one causal stream per row, positions 0..L-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from stoker.accel.backends.training import TrainingStep
from stoker.accel.batch import ReceivedBatch
from stoker.protos.errors import ConfigError

# (width, layers, heads): small enough to train on a CPU, big enough to learn real text
SIZES = {"gpt-tiny": (64, 2, 4)}
IGNORE = -100  # a label that predicts nothing


def causal_mask(length: int, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Which positions each may attend to, True = allowed: (L, L) for one causal stream, or (B, L, L)
    with `segment_ids` (B, L): only earlier positions of the same segment (padding, segment 0, sees
    earlier padding, so no row of the mask is empty)."""
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    if segment_ids is None:
        return causal
    causal = causal.to(segment_ids.device)
    return (segment_ids[:, :, None] == segment_ids[:, None, :]) & causal


class TinyGPT(nn.Module):
    """A GPT-style decoder: `forward(input_ids, position_ids=None, segment_ids=None)` gives next-token
    logits (B, L, vocab)."""

    def __init__(self, vocab_size: int, max_len: int, width: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(max_len, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2's
        nn.init.normal_(self.tokens.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        rows, length = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).expand(rows, length)
        allowed = causal_mask(length, segment_ids).to(input_ids.device)
        if allowed.dim() == 3:  # one (L, L) mask per row and head, as nn.MultiheadAttention takes them
            allowed = allowed.repeat_interleave(self.heads, dim=0)
        x = self.tokens(input_ids) + self.positions(position_ids)
        x = self.blocks(x, mask=~allowed)  # True = may not attend
        return self.head(self.norm(x))


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the positions that predict something (0 for a batch with none)."""
    flat = labels.long().flatten()
    total = nn.functional.cross_entropy(logits.flatten(0, 1).float(), flat, ignore_index=IGNORE, reduction="sum")
    return total / (flat != IGNORE).sum().clamp(min=1)


@dataclass
class GPTAccelerator(TrainingStep):
    model_name: str
    vocab_size: int
    seq_len: int
    device: str = "cpu"
    lr: float = 1e-3
    weight_decay: float = 0.01
    log_every: int = 20
    name: str = "torch"
    losses: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.model_name not in SIZES:
            raise ConfigError(f"unknown model {self.model_name!r} for a tokens job (choose {', '.join(SIZES)})")
        if self.vocab_size < 1:
            raise ConfigError("a tokens job's manifest names no vocabulary size: prepare it with `stoker prepare "
                              "tokens`")
        width, layers, heads = SIZES[self.model_name]
        self.model = TinyGPT(self.vocab_size, self.seq_len, width, layers, heads).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        self.steps = 0

    def prepare(self, batch: ReceivedBatch) -> dict[str, torch.Tensor]:
        names = batch.tensors.parts.keys()
        return {n: torch.from_numpy(np.asarray(batch.tensor(n))).to(self.device, non_blocking=True).long()
                for n in names}

    def step_prepared(self, t: dict[str, torch.Tensor]) -> None:
        self.model.train()
        logits = self.model(t["input_ids"], t.get("position_ids"), t.get("segment_ids"))
        loss = next_token_loss(logits, t["labels"])
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.record(loss)
