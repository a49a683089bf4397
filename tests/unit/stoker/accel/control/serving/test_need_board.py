"""The job's need: its ranks' last words, summed over those heard lately."""

from stoker.accel.control.fleet_member import Need
from stoker.accel.control.serving.need_board import NeedBoard


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_ranks_heard_lately_are_summed_and_a_quiet_one_drops_out():
    clock = Clock()
    board = NeedBoard(clock, fresh_s=10.0)
    assert not board.total().measured
    board.heard(0, Need(True, 2.0, 0.1, 1.5, "decode"))
    clock.now = 5.0
    board.heard(1, Need(True, 3.0, 0.3, 2.0, "credit"))
    total = board.total()
    assert total.cores_needed == 5.0 and total.cores_in_use == 3.5 and total.stall_fraction == 0.3
    assert total.stage == "credit"
    clock.now = 10.0  # rank 0 at the bound: still counted
    assert board.total().cores_needed == 5.0
    clock.now = 10.5
    assert board.total().cores_needed == 3.0
