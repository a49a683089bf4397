"""stoker/flags.py: the checks that refuse, at parse time, a value that cannot work."""

from __future__ import annotations

import argparse

import pytest

from stoker.flags import MAX_INT, NON_NEGATIVE, POSITIVE, SECONDS, SEED, endpoint, output_folder


@pytest.mark.parametrize("text", ["0", "-3", "1_0", "٣", "1.5", "", "5000000000", str(MAX_INT + 1)])
def test_a_count_is_a_plain_integer_the_wire_can_carry(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be an integer >= 1"):
        POSITIVE(text)


def test_counts_and_seeds_in_range_are_taken():
    assert (POSITIVE("7"), POSITIVE(" 8 "), POSITIVE(str(MAX_INT)), NON_NEGATIVE("0")) == (7, 8, MAX_INT, 0)
    assert SEED(str(2**64 - 1)) == 2**64 - 1  # the wire's seed is a uint64
    with pytest.raises(argparse.ArgumentTypeError, match="at most"):
        SEED(str(2**64))


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "0", "-1", "x"])
def test_seconds_are_finite_and_above_zero(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be a number > 0"):
        SECONDS(text)


@pytest.mark.parametrize("text", ["tcp://127.0.0.1:5561", "tcp://127.0.0.1:0", "tcp://*:5560", "tcp://[::1]:5561",
                                  "tcp://accel-0.example:5561", "ipc:///tmp/stoker.sock", "inproc://x"])
def test_endpoints_zeromq_takes_are_taken(text):
    assert endpoint(text) == text


@pytest.mark.parametrize("text", ["5", "notanendpoint", "tcp://127.0.0.1:99999", "tcp://127.0.0.1", "tcp://:5561",
                                  "udp://h:1", "tcp://h:port", "ipc://"])
def test_endpoints_that_cannot_work_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="must be an endpoint"):
        endpoint(text)


def test_a_folder_to_write_into_is_refused_at_parse_time_when_it_is_a_file_or_cannot_be_made(tmp_path):
    """--record-steps DIR: refused now, not at the job's first step."""
    (tmp_path / "a-file").write_text("")
    assert output_folder(str(tmp_path / "new")) == str(tmp_path / "new")  # made when the job starts
    assert output_folder(str(tmp_path)) == str(tmp_path)
    with pytest.raises(argparse.ArgumentTypeError, match="it is a file, not a folder"):
        output_folder(str(tmp_path / "a-file"))
    with pytest.raises(argparse.ArgumentTypeError, match="cannot make the folder"):
        output_folder(str(tmp_path / "missing" / "deeper"))
