"""The `torch` accelerator for text: BERT pretraining steps with transformers' BertForPreTraining.

The model is built from a config (nothing is downloaded). Masked-LM logits are computed only
at the masked positions (gathered before the vocabulary projection, which is where most of
the head's cost is). Padded and packed batches both work: a packed row's `attention_mask`
(k for the k-th sequence) becomes a block-diagonal boolean mask, its `position_ids` restart
per sequence, and the next-sentence head reads each sequence's own [CLS].
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from stoker.accel.backends.optimizers import LAMB
from stoker.accel.backends.training import TrainingStep
from stoker.accel.batch import ReceivedBatch
from stoker.protos.errors import ConfigError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# (hidden, layers, heads, intermediate): BERT-base and -large as published; tiny for tests
SIZES = {"bert-tiny": (128, 2, 2, 512), "bert-base": (768, 12, 12, 3072), "bert-large": (1024, 24, 16, 4096)}


@dataclass
class BertAccelerator(TrainingStep):
    model_name: str
    vocab_size: int
    seq_len: int
    device: str = "cpu"
    lr: float = 1e-4
    optimizer_name: str = "adamw"  # or "lamb" (MLPerf's BERT optimizer)
    log_every: int = 20
    name: str = "torch"
    losses: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        from transformers import BertConfig, BertForPreTraining

        if self.model_name not in SIZES:
            raise ConfigError(f"unknown model {self.model_name!r} (choose {', '.join(SIZES)})")
        hidden, layers, heads, intermediate = SIZES[self.model_name]
        config = BertConfig(vocab_size=self.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=heads, intermediate_size=intermediate,
                            max_position_embeddings=max(512, self.seq_len))
        # transformers wraps to() in a decorator whose typing hides the signature; it takes a device
        self.model = BertForPreTraining(config).to(self.device)  # type: ignore[arg-type]
        # The parts a step calls, typed: transformers' heads have unannotated __init__s, so attribute
        # access (model.cls.predictions) types as nn.Module.__getattr__'s Tensor | Module.
        self._encoder = self.model.get_submodule("bert")
        self._pooler_dense = self.model.get_submodule("bert.pooler.dense")
        self._pooler_activation = self.model.get_submodule("bert.pooler.activation")
        self._mlm_head = self.model.get_submodule("cls.predictions")
        self._nsp_head = self.model.get_submodule("cls.seq_relationship")
        if self.optimizer_name == "lamb":
            self.optimizer = LAMB(self.model.parameters(), lr=self.lr)
        elif self.optimizer_name == "adamw":
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.01)
        else:
            raise ConfigError(f"optimizer {self.optimizer_name!r}: choose adamw or lamb for BERT")
        self.ce = nn.CrossEntropyLoss(reduction="none")
        self.steps = 0

    def prepare(self, batch: ReceivedBatch) -> dict[str, torch.Tensor]:
        names = batch.tensors.parts.keys()
        t = {n: torch.from_numpy(np.asarray(batch.tensor(n))).to(self.device, non_blocking=True) for n in names}
        packed = "position_ids" in t
        mask = t["attention_mask"]
        if packed:  # token p sees token q only inside its own sequence
            t["attention_4d"] = ((mask[:, :, None] == mask[:, None, :]) & (mask[:, :, None] != 0))[:, None]
        return t

    def step_prepared(self, t: dict[str, torch.Tensor]) -> None:
        packed = "attention_4d" in t
        out = self._encoder(input_ids=t["input_ids"].long(), token_type_ids=t["token_type_ids"].long(),
                              attention_mask=t["attention_4d"] if packed else t["attention_mask"].long(),
                              position_ids=t["position_ids"].long() if packed else None)
        hidden = out.last_hidden_state
        width = hidden.shape[-1]
        positions = t["masked_lm_positions"].long()
        at_masks = hidden.gather(1, positions[..., None].expand(-1, -1, width))
        logits = self._mlm_head(at_masks)
        weights = t["masked_lm_weights"].float()
        mlm = (self.ce(logits.flatten(0, 1), t["masked_lm_ids"].long().flatten()) * weights.flatten()).sum()
        mlm = mlm / weights.sum().clamp(min=1)
        if packed:
            heads = hidden.gather(1, t["next_sentence_positions"].long()[..., None].expand(-1, -1, width))
            pooled = self._pooler_activation(self._pooler_dense(heads))
            nsp_logits = self._nsp_head(pooled)
            nsp_weights = t["next_sentence_weights"].float().flatten()
            nsp = (self.ce(nsp_logits.flatten(0, 1), t["next_sentence_labels"].long().flatten()) * nsp_weights).sum()
            nsp = nsp / nsp_weights.sum().clamp(min=1)
        else:
            nsp = self.ce(self._nsp_head(out.pooler_output), t["next_sentence_labels"].long()).mean()
        loss = mlm + nsp
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.record(loss)
