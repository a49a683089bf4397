"""A process's activity slot: what it notes is what another process reads, and nothing is noted without one."""

import multiprocessing as mp
import time

from stoker.pipeline import activity
from stoker.pipeline.activity import ActivitySlot, Phase


def _transform_sample_7(slot: ActivitySlot) -> None:
    activity.install(slot)
    activity.note(Phase.TRANSFORMING, 3, 7)


def test_what_a_process_notes_is_what_its_daemon_reads_after_it_died():
    ctx = mp.get_context("spawn")
    slot = ActivitySlot(ctx)
    assert slot.read().phase == Phase.IDLE
    child = ctx.Process(target=_transform_sample_7, args=(slot,))
    child.start()
    child.join(60)
    time.sleep(0.05)
    seen = slot.read()
    assert (seen.phase, seen.unit_id, seen.sample_id, seen.name) == (Phase.TRANSFORMING, 3, 7, "transforming")
    assert 0.05 <= seen.for_s < 60


def test_note_without_a_slot_does_nothing_and_a_slot_keeps_the_last_phase():
    activity.install(None)
    activity.note(Phase.SENDING, 1)  # no slot: nothing to write, nothing raised
    slot = ActivitySlot(mp.get_context("spawn"))
    activity.install(slot)
    try:
        activity.note(Phase.READING, 5, 9)
        activity.note(Phase.WAITING_FOR_CREDIT)
        seen = slot.read()
        assert (seen.phase, seen.unit_id, seen.sample_id, seen.name) == (Phase.WAITING_FOR_CREDIT, -1, -1,
                                                                         "waiting for credit")
    finally:
        activity.install(None)
