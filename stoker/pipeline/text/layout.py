"""The tensors of a text batch, unpacked or packed, and how sequences are written into them.

Unpacked (one sequence per row, BERT's reference names and shapes):
  input_ids, token_type_ids, attention_mask (1 = token, 0 = padding)   (B, L) int32
  masked_lm_positions, masked_lm_ids (B, P) int32; masked_lm_weights (B, P) float32
  next_sentence_labels (B,) int32 (1 = B is a random next sentence)
Packed (up to S sequences per row), as the packed-BERT models expect:
  input_ids, token_type_ids, position_ids (restart at 0 for every sequence)  (B, L) int32
  attention_mask (B, L) int32: 0 = padding, k = the row's k-th sequence; token p may attend
      to token q only when attention_mask[p] == attention_mask[q] != 0 (`attention_blocks`)
  masked_lm_positions, masked_lm_ids (B, P) int32; masked_lm_weights (B, P) float32
  next_sentence_positions (B, S) int32 (where each sequence's [CLS] is),
  next_sentence_labels (B, S) int32, next_sentence_weights (B, S) float32 (0 = no sequence)
"""

from __future__ import annotations

import numpy as np

from stoker.pipeline.tensors import TensorSpec
from stoker.pipeline.text.examples import Sequence, TextConfig


def tensor_specs(cfg: TextConfig) -> dict[str, TensorSpec]:
    length, preds = cfg.seq_len, cfg.predictions_per_row
    specs = {
        "input_ids": TensorSpec("<i4", (length,)),
        "token_type_ids": TensorSpec("<i4", (length,)),
        "attention_mask": TensorSpec("<i4", (length,)),
        "masked_lm_positions": TensorSpec("<i4", (preds,)),
        "masked_lm_ids": TensorSpec("<i4", (preds,)),
        "masked_lm_weights": TensorSpec("<f4", (preds,)),
    }
    if not cfg.pack:
        specs["next_sentence_labels"] = TensorSpec("<i4", ())
        return specs
    seqs = cfg.sequences_per_row
    specs["position_ids"] = TensorSpec("<i4", (length,))
    specs["next_sentence_positions"] = TensorSpec("<i4", (seqs,))
    specs["next_sentence_labels"] = TensorSpec("<i4", (seqs,))
    specs["next_sentence_weights"] = TensorSpec("<f4", (seqs,))
    return specs


def assemble(rows: list[list[Sequence]], cfg: TextConfig) -> dict[str, np.ndarray]:
    """Write the rows' sequences into zero-padded arrays of `tensor_specs(cfg)`."""
    n = len(rows)
    out = {name: np.zeros((n, *spec.shape), dtype=spec.dtype) for name, spec in tensor_specs(cfg).items()}
    positions = np.arange(cfg.seq_len, dtype=np.int32)
    for r, row in enumerate(rows):
        at = slot = 0
        for k, seq in enumerate(row):
            size, end = len(seq), at + len(seq)
            out["input_ids"][r, at:end] = seq.tokens
            out["token_type_ids"][r, at + seq.len_a + 2: end] = 1
            out["attention_mask"][r, at:end] = k + 1
            npred = seq.masked_positions.size
            out["masked_lm_positions"][r, slot: slot + npred] = seq.masked_positions + at
            out["masked_lm_ids"][r, slot: slot + npred] = seq.masked_ids
            out["masked_lm_weights"][r, slot: slot + npred] = 1.0
            if cfg.pack:
                out["position_ids"][r, at:end] = positions[:size]
                out["next_sentence_positions"][r, k] = at
                out["next_sentence_labels"][r, k] = int(seq.is_random_next)
                out["next_sentence_weights"][r, k] = 1.0
            else:
                out["next_sentence_labels"][r] = int(seq.is_random_next)
            at, slot = end, slot + npred
    return out


def attention_blocks(attention_mask: np.ndarray) -> np.ndarray:
    """(B, L, L) bool: may token p attend to token q? Works for packed and unpacked masks."""
    m = attention_mask
    return (m[:, :, None] == m[:, None, :]) & (m[:, :, None] != 0)
