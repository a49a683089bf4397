"""stoker/accel/backends/gpt_accel.py: the tiny GPT of a tokens job. Attention stays inside each packed
document and positions restart (packing is invisible to the model), a concat row is causal, the loss
counts only labelled positions, and AdamW steps on real text make the loss fall."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.accel.backends.accelerators import AccelSpec, make_accelerator
from stoker.accel.backends.gpt_accel import IGNORE, GPTAccelerator, TinyGPT, causal_mask, next_token_loss
from stoker.pipeline.text.causal import CausalConfig, causal_rows
from stoker.pipeline.text.shipped import bpe_tokenizer_config, read_chapters
from stoker.protos.errors import ConfigError

VOCAB, LENGTH = 50, 24


@pytest.fixture(scope="module")
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(VOCAB, LENGTH, width=32, layers=2, heads=4).eval()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=3).filter(lambda n: sum(n) <= LENGTH), st.randoms())
def test_a_packed_row_gives_each_document_the_logits_it_gets_alone(model, lengths, rng):
    documents = [[rng.randrange(VOCAB) for _ in range(n)] for n in lengths]
    padding = LENGTH - sum(lengths)
    ids = torch.tensor([[t for d in documents for t in d] + [0] * padding])
    positions = torch.tensor([[p for d in documents for p in range(len(d))] + [0] * padding])
    segments = torch.tensor([[s for s, d in enumerate(documents, 1) for _ in d] + [0] * padding])
    with torch.no_grad():
        packed = model(ids, positions, segments)[0]
        start = 0
        for document in documents:
            alone = model(torch.tensor([document]))[0]
            torch.testing.assert_close(packed[start:start + len(document)], alone, atol=1e-5, rtol=1e-5)
            start += len(document)
        assert torch.isfinite(packed).all()  # padding rows of the mask are never empty


def test_a_concat_row_is_causal_a_later_token_changes_nothing_before_it(model):
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % VOCAB
    with torch.no_grad():
        before, after = model(ids), model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_the_mask_lets_a_token_see_only_the_earlier_tokens_of_its_own_segment():
    allowed = causal_mask(5, torch.tensor([[1, 1, 2, 2, 0]]))[0]
    assert allowed.tolist() == [[True, False, False, False, False], [True, True, False, False, False],
                                [False, False, True, False, False], [False, False, True, True, False],
                                [False, False, False, False, True]]
    assert torch.equal(causal_mask(3), torch.ones(3, 3, dtype=torch.bool).tril())


def test_the_loss_is_the_mean_over_labelled_positions_only():
    logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([[1, IGNORE, 3], [IGNORE, IGNORE, 6]])
    keep = labels != IGNORE
    expected = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(next_token_loss(logits, labels), expected)
    assert next_token_loss(logits, torch.full((2, 3), IGNORE)).item() == 0.0  # nothing to predict: 0, not NaN


def _real_batches(rows: int = 8, seq_len: int = 32) -> list[dict[str, torch.Tensor]]:
    """Packed rows of Genesis in the real byte-level BPE, as a tokens job's batches hold them."""
    tok = bpe_tokenizer_config().load()
    documents = tok.encode_batch([text[:600] for _, text in read_chapters()[:12]])
    made = causal_rows(documents, CausalConfig(seq_len, tok.eot_id, tok.pad_id, "packed", drop_last=False))
    names = ("input_ids", "labels", "position_ids", "segment_ids")
    return [{n: torch.from_numpy(getattr(made, n)[i:i + rows]).long() for n in names}
            for i in range(0, len(made.input_ids) - rows + 1, rows)][:2]


def test_adamw_steps_on_real_text_make_the_loss_fall():
    torch.manual_seed(0)
    batches = _real_batches()
    accel = make_accelerator(AccelSpec(kind="torch", lr=1e-3), "tokens", 0, 65000, 32)
    assert isinstance(accel, GPTAccelerator) and accel.model_name == "gpt-tiny"
    for step in range(24):
        accel.step_prepared(batches[step % len(batches)])
    assert len(accel.losses) == accel.steps == 24
    assert np.mean(accel.losses[-4:]) < np.mean(accel.losses[:4]) - 1.0  # it starts near ln 65000 = 11.1
    state = accel.state_dict()
    again = GPTAccelerator("gpt-tiny", 65000, 32)
    again.load_state_dict(state)
    pairs = zip(again.model.state_dict().values(), accel.model.state_dict().values(), strict=True)
    assert again.steps == 24 and all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize(("spec", "says"), [
    (AccelSpec(kind="torch", model="bert-tiny"), "--model bert-tiny needs --dataset wikipedia"),
    (AccelSpec(kind="torch", optimizer="lamb"), "--optimizer lamb: a tokens job's GPT steps with adamw"),
])
def test_a_model_or_optimizer_a_tokens_job_cannot_use_is_refused_in_one_line(spec, says):
    with pytest.raises(ConfigError, match=says):
        make_accelerator(spec, "tokens", 0, 100, 16)


def test_an_image_job_refuses_the_gpt_and_a_manifest_without_a_vocabulary_is_refused():
    with pytest.raises(ConfigError, match="--model gpt-tiny needs a tokens job"):
        make_accelerator(AccelSpec(kind="torch", model="gpt-tiny"), "imagenet", 10)
    with pytest.raises(ConfigError, match="names no vocabulary size"):
        GPTAccelerator("gpt-tiny", 0, 16)
    with pytest.raises(ConfigError, match="unknown model 'gpt-huge'"):
        GPTAccelerator("gpt-huge", 100, 16)
