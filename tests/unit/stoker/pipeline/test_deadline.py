"""The per-call time limit: it interrupts a call that runs too long, leaves a quick one alone, and
does nothing off the main thread."""

from __future__ import annotations

import threading
import time

import pytest

from stoker.pipeline.deadline import CallLimit, TransformTimeout, arm, disarm


def test_a_call_past_its_limit_is_interrupted_and_a_quick_one_is_not():
    started = time.monotonic()
    assert arm(0.2)
    with pytest.raises(TransformTimeout):
        try:
            time.sleep(5)
        finally:
            disarm()
    assert time.monotonic() - started < 2
    assert arm(0.2)
    try:
        time.sleep(0.01)
    finally:
        disarm()
    time.sleep(0.3)  # disarmed: nothing fires later (letting the limit's time pass is the test)


def test_no_limit_applies_off_the_main_thread_or_at_zero():
    armed = []
    thread = threading.Thread(target=lambda: armed.append(arm(0.1)))
    thread.start()
    thread.join()
    assert armed == [False] and arm(0) is False


def _call(limit: CallLimit, seconds: float, swallow: bool = False) -> None:
    armed = limit.begin()
    try:
        if swallow:
            try:
                time.sleep(seconds)
            except TransformTimeout:  # a transform's bare except: the timeout comes again
                time.sleep(seconds)
        else:
            time.sleep(seconds)
    finally:
        limit.end(armed)


def test_in_a_run_each_call_has_its_whole_limit_and_one_past_it_is_interrupted():
    """The timer is set once for the run: calls that together run past the limit are left alone,
    one call past it is interrupted near its limit, and a swallowed timeout comes again."""
    limit = CallLimit(0.2)
    with limit:
        for _ in range(4):  # 0.4 s in all, 0.1 s each
            _call(limit, 0.1)
        started = time.monotonic()
        with pytest.raises(TransformTimeout):
            _call(limit, 5)
        assert 0.15 < time.monotonic() - started < 1
        with pytest.raises(TransformTimeout):
            _call(limit, 5, swallow=True)
        _call(limit, 0.05)  # the run goes on after a timeout
    time.sleep(0.3)  # the run is over: nothing fires later (letting the limit's time pass is the test)


def test_outside_a_run_a_call_is_armed_on_its_own():
    limit = CallLimit(0.2)
    started = time.monotonic()
    with pytest.raises(TransformTimeout):
        _call(limit, 5)
    assert time.monotonic() - started < 1 and not limit.running
    time.sleep(0.3)  # the call is over: nothing fires later (letting the limit's time pass is the test)
