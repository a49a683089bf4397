"""stoker/pipeline/kinds.py: each dataset kind described once, and consistent with the wire and the workers."""

import pytest

from stoker.pipeline.job import JobConfig
from stoker.pipeline.kinds import KINDS, kind_of
from stoker.protos import stoker_pb2 as pb
from stoker.workers.sources import SOURCES


def test_an_unknown_kind_names_the_known_ones():
    with pytest.raises(ValueError, match="imagenet, wikipedia"):
        kind_of("audio")


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_has_its_stages_on_the_wire_and_a_worker_source(name):
    kind = kind_of(name)
    assert set(kind.stages) <= set(pb.StageSeconds.DESCRIPTOR.fields_by_name)  # what the header carries
    assert name in SOURCES


@pytest.mark.parametrize("decode_on", ["host", "accelerator"])
def test_an_image_layout_is_what_the_schema_expects(decode_on):
    job = JobConfig(manifest_uri="m", image_size=96, decode_on=decode_on)
    layout = job.kind.layout(job)
    assert layout.rows_are_samples
    if decode_on == "host":
        assert layout.tensors["image"].shape == (96, 96, 3) and not layout.ragged
    else:
        assert layout.ragged == {"jpeg": "jpeg_end"} and "image" not in layout.tensors


def test_a_text_layout_follows_packing():
    from stoker.pipeline.text.examples import TextConfig

    packed = JobConfig(manifest_uri="m", dataset="wikipedia", text=TextConfig(seq_len=512, pack=True))
    layout = packed.kind.layout(packed)
    assert not layout.rows_are_samples and layout.tensors["next_sentence_labels"].shape == (3,)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_says_what_plans_and_small_experiments_need(name):
    from stoker.accel.backends.profiles import PROFILES, profile_rate

    kind = kind_of(name)
    assert kind.workload.samples > 0 and kind.pod16_over_dgx > 0
    assert 0 < kind.small_scale.run <= 1 and 0 < kind.small_scale.sweep <= 1 and kind.small_scale.sweep_cores
    assert profile_rate("a100", name) == PROFILES["a100"].rates[kind.model_family] > 0
