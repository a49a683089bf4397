"""Real PyTorch training steps on batches that came through real worker processes and sockets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stoker.accel.backends.accelerators import AccelSpec, make_accelerator
from stoker.accel.backends.models.resnet import resnet18, resnet50
from tests.helpers import assert_exactly_once, consumer_for


def test_resnet_parameter_counts_match_torchvision():
    assert sum(p.numel() for p in resnet50().parameters()) == 25_557_032
    assert sum(p.numel() for p in resnet18().parameters()) == 11_689_512


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
def test_resnet18_learns_from_stoker_batches_and_times_add_up(manifest, run_job, overlap):
    torch.manual_seed(0)  # the same initial model every run: only the arrival order of batches varies
    accel = make_accelerator(AccelSpec(kind="torch", model="resnet18", width=16, lr=0.1), "imagenet",
                             len(manifest.classes))
    consumer = consumer_for(manifest.uri, epochs=6, batch_size=16, unit_batches=2, image_size=112, transform="eval",
                            accel=accel, overlap=overlap)
    job = run_job(consumer, hosts=1)  # one host: units in plan order, so the run repeats exactly
    summary = job.finish(timeout=300)
    assert_exactly_once(summary, manifest.num_samples, 6)
    per_epoch = len(accel.losses) // 6
    first, last = np.mean(accel.losses[:per_epoch]), np.mean(accel.losses[-per_epoch:])
    assert last < 0.7 * first, f"loss did not fall: {first:.3f} -> {last:.3f}"
    s = summary.stage_seconds
    accounted = summary.startup_s + s["stall"] + s["step"] + (0 if overlap else s["copy"])
    assert abs(accounted - summary.elapsed_s) < 0.05 * summary.elapsed_s, (accounted, summary.elapsed_s)
    assert s["copy"] > 0


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_tiny_bert_steps_on_wikipedia_batches_from_real_workers(wiki_manifest, run_job, pack):
    from stoker.pipeline.text.examples import TextConfig

    accel = make_accelerator(AccelSpec(kind="torch", model="bert-tiny", lr=1e-3), "wikipedia", 0,
                             wiki_manifest.vocab_size, 128)
    consumer = consumer_for(wiki_manifest.uri, epochs=1, dataset="wikipedia", batch_size=32,
                            text=TextConfig(seq_len=128, pack=pack), accel=accel)
    summary = run_job(consumer, hosts=1).finish(timeout=300)
    assert_exactly_once(summary, wiki_manifest.num_samples, 1)
    assert len(accel.losses) == summary.batches and all(np.isfinite(accel.losses))
    assert np.mean(accel.losses[-5:]) < np.mean(accel.losses[:5]) - 1.0  # it learns (MLM starts near ln 30522)


def test_a_packed_row_gives_each_sequence_the_same_hidden_states_as_alone():
    """The block-diagonal mask and restarted positions make packing invisible to the model."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    model.eval()
    a, b = torch.tensor([[1, 5, 6, 2]]), torch.tensor([[1, 7, 8, 9, 2]])
    row = torch.cat([a, b, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 4 + [2] * 5 + [0] * 3])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 0, 0]])
    blocks = ((mask[:, :, None] == mask[:, None, :]) & (mask[:, :, None] != 0))[:, None]
    packed = model(input_ids=row, attention_mask=blocks, position_ids=positions).last_hidden_state[0]
    assert torch.allclose(packed[:4], model(input_ids=a).last_hidden_state[0], atol=1e-5)
    assert torch.allclose(packed[4:9], model(input_ids=b).last_hidden_state[0], atol=1e-5)


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_large_batch_optimizers_fit_a_small_problem(name):
    import torch

    from stoker.accel.backends.optimizers import LAMB, LARS

    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = (x @ torch.randn(16, 4)).argmax(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = LARS(model.parameters(), lr=5.0, weight_decay=0.0) if name == "lars" else LAMB(model.parameters(), lr=0.02)
    losses = []
    for _ in range(150):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


def test_optimizer_choice_reaches_the_backends(manifest):
    from stoker.accel.backends.optimizers import LAMB, LARS

    resnet = make_accelerator(AccelSpec(kind="torch", model="resnet18", width=16, optimizer="lars"), "imagenet", 4)
    bert = make_accelerator(AccelSpec(kind="torch", model="bert-tiny", optimizer="lamb", lr=1e-3), "wikipedia", 0,
                            30522, 128)
    assert isinstance(resnet.optimizer, LARS) and isinstance(bert.optimizer, LAMB)
    with pytest.raises(ValueError, match="sgd or lars"):
        make_accelerator(AccelSpec(kind="torch", model="resnet18", width=16, optimizer="lamb"), "imagenet", 4)


def test_the_gpu_check_script_runs_its_four_measurements_as_a_dry_run_on_the_cpu(manifest):
    """No GPU here: --dry-run takes every path of benchmarks/gpu_check.py except the CUDA ones."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--data", manifest.uri],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    for run in ("| ceiling |", "| overlap |", "| serial |", "| decode-on-accelerator |"):
        assert run in out.stdout
    assert "Overlap gain (overlap / serial):" in out.stdout
