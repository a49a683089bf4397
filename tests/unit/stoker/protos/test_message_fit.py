"""stoker/protos/message_fit.py: a batch of tensors, described by dtype and row shape alone, fits one data
message or is told why not: a row over a frame, too many frames, a header over its limit."""

from __future__ import annotations

from typing import NamedTuple

from stoker.protos import message_fit
from stoker.protos.framing import MAX_FRAME_BYTES, MAX_FRAMES, MAX_HEADER_BYTES


class Spec(NamedTuple):
    """A tensor as message_fit reads it: the wire needs no class of the data model."""

    dtype: str
    shape: tuple[int, ...]


def test_a_row_over_a_frame_is_named():
    rows_of_a_frame = Spec("|u1", (MAX_FRAME_BYTES,))
    assert message_fit.problem(1, {"x": rows_of_a_frame}) is None
    why = message_fit.problem(1, {"x": Spec("|u1", (MAX_FRAME_BYTES + 1,))})
    assert why == f"one row of x is {MAX_FRAME_BYTES + 1} bytes, over the {MAX_FRAME_BYTES}-byte frame limit"


def test_every_row_of_a_frame_of_its_own_counts_towards_the_frame_limit():
    one_frame_each = Spec("<f4", (MAX_FRAME_BYTES // 4,))
    assert message_fit.problem(MAX_FRAMES, {"x": one_frame_each}) is None
    assert message_fit.problem(MAX_FRAMES + 1, {"x": one_frame_each}) == \
        f"a batch takes {MAX_FRAMES + 1} frames, over the {MAX_FRAMES} a message may carry"


def test_a_ragged_tensor_takes_one_frame_whatever_its_rows():
    tensors = {"bytes": Spec("|u1", ()), "ends": Spec("<i8", ())}
    assert message_fit.problem(10, tensors, ragged={"bytes": "ends"}) is None


def test_a_header_over_its_limit_is_named():
    rows = MAX_HEADER_BYTES // message_fit.HEADER_BYTES_PER_ROW
    assert "header takes about" in message_fit.problem(rows, {"x": Spec("|u1", ())})
