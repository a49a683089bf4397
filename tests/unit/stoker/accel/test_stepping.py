"""stoker/accel/stepping.py: a backend says what it can do by its base classes; one adapter runs any of them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stoker.accel import checkpoint
from stoker.accel.backends.accelerators import (
    AccelSpec,
    ConvertingSimulatedAccelerator,
    NullAccelerator,
    SimulatedAccelerator,
)
from stoker.accel.stepping import PreparedStep, Stateful, Step, StepRunner, given


@dataclass
class Plain(Step):
    seen: list = field(default_factory=list)

    def step(self, batch) -> None:
        self.seen.append(batch)


@dataclass
class TwoPhase(PreparedStep, Stateful):
    calls: list = field(default_factory=list)
    steps: int = 0

    def prepare(self, batch):
        self.calls.append(("prepare", batch))
        return f"prepared {batch}"

    def step_prepared(self, prepared) -> None:
        self.calls.append(("step", prepared))
        self.steps += 1

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


def test_a_plain_step_gets_no_prepare_hook_and_the_received_batch():
    runner = StepRunner(backend := Plain())
    assert runner.prepare is None
    runner.run("batch 1", None)
    assert backend.seen == ["batch 1"]


def test_a_two_phase_step_is_prepared_ahead_and_stepped_on_what_was_prepared():
    runner = StepRunner(backend := TwoPhase())
    prepared = runner.prepare("b")  # what the loader's prefetch thread calls
    runner.run("b", prepared)
    assert backend.calls == [("prepare", "b"), ("step", "prepared b")]
    backend.step("c")  # step() alone still does both halves
    assert backend.calls[-2:] == [("prepare", "c"), ("step", "prepared c")]


def test_a_backend_missing_half_of_its_contract_cannot_be_made():
    class Half(PreparedStep):
        def prepare(self, batch):
            return batch

    with pytest.raises(TypeError, match="step_prepared"):
        Half()


def test_only_stateful_backends_are_checkpointed(tmp_path):
    assert not checkpoint.load_model(NullAccelerator(), tmp_path / "data.json")
    assert not isinstance(SimulatedAccelerator(rate=10), Stateful)
    assert isinstance(ConvertingSimulatedAccelerator(rate=10), PreparedStep)


def test_a_spec_makes_its_backend_for_the_job_it_is_given(manifest):
    from stoker.pipeline.job import JobConfig

    job = JobConfig(manifest_uri=manifest.uri)
    made = AccelSpec(kind="simulated", profile="a100", scale=0.1).factory()(job, manifest)
    assert isinstance(made, SimulatedAccelerator) and made.rate == pytest.approx(250)
    backend = Plain()
    assert given(backend)(job, manifest) is backend


def test_a_simulated_system_counts_bert_in_sequences_as_its_profile_does(monkeypatch):
    """A packed row of three sequences is three of the profile's; images and a plain --rate count rows."""
    from types import SimpleNamespace

    import numpy as np

    from stoker.accel.batch import ReceivedBatch
    from stoker.protos import stoker_pb2 as pb

    text = pb.BatchHeader(rows=2)
    text.text.sequences = 6
    no_tensors = SimpleNamespace(parts={})  # the rate reads the header alone
    packed = ReceivedBatch(b"p", text, no_tensors, np.arange(6), 0.0)  # type: ignore[arg-type]
    waited: list[float] = []
    monkeypatch.setattr(SimulatedAccelerator, "compute", lambda self, amount: waited.append(amount / self.rate))
    SimulatedAccelerator(rate=10, per_sequence=True).step(packed)
    SimulatedAccelerator(rate=10).step(packed)
    assert waited == [pytest.approx(0.6), pytest.approx(0.2)]
    assert ConvertingSimulatedAccelerator(rate=10, per_sequence=True).prepare(packed) == 6


@pytest.mark.parametrize("seq_len", [64, 1024])
def test_a_simulated_system_steps_a_tokens_job_at_its_stated_tokens_per_second(seq_len):
    """The a100 profile's GPT-2 rate is 104 rows of 1024 tokens a second (106,496 tokens/s, as `stoker run`
    states it): a row of 64 takes a 16th of a row of 1024, not a whole sequence's 1/104 s; and short steps
    keep the rate (a sleep's overrun is taken off the next)."""
    import time
    from types import SimpleNamespace

    import numpy as np

    from stoker.accel.backends.accelerators import make_accelerator
    from stoker.accel.backends.profiles import GPT_PROFILE_SEQ_LEN, profile_rate
    from stoker.accel.batch import ReceivedBatch
    from stoker.protos import stoker_pb2 as pb

    stated = profile_rate("a100", "tokens") * GPT_PROFILE_SEQ_LEN
    device = make_accelerator(AccelSpec(kind="simulated", profile="a100"), "tokens", 0, 300, seq_len)
    header = pb.BatchHeader(rows=4)
    header.text.sequences = 9  # packed: more sequences than rows, which a tokens job's rate does not count
    batch = ReceivedBatch(b"p", header, SimpleNamespace(parts={}), np.arange(9), 0.0)  # type: ignore[arg-type]
    assert device.amount(batch) == 4 * seq_len
    steps = 200 if seq_len == 64 else 12
    started = time.perf_counter()
    for _ in range(steps):
        device.step(batch)
    measured = steps * 4 * seq_len / (time.perf_counter() - started)
    assert measured == pytest.approx(stated, rel=0.1)
