"""A time limit on one call of a transform: the user's code may hang, the worker must not.

The worker process calls transforms on its main thread, so a real-time interval timer
(SIGALRM) interrupts a call that runs too long by raising `TransformTimeout` inside it, and
the sample is skipped and counted like one the transform raised on. A call stuck inside C
code that never returns to the interpreter is not interrupted: the dispatcher's lease timeout
(--lease-timeout) then leases its unit again elsewhere. Off the main thread (where signals
cannot be delivered) the limit is not applied. The handler is put back only when something
else took SIGALRM meanwhile (a test runner's own timer): a call costs a look at the handler
and two setitimer calls, about 8 us here, not a handler swap.

A worker calls the transform once per sample, and arming the timer around every call cost 4-5%
of a worker core (benchmarks/transform_contract.py), far more than its 8 us in a loop of its own.
`CallLimit` sets the timer once for a run of calls (a batch): each call only notes when it
began, and when the timer fires the handler interrupts the call under way if it has run its
limit, or sets the timer again for what that call has left.
"""

from __future__ import annotations

import signal
import threading
import time


class TransformTimeout(BaseException):
    """The call ran past its limit. A BaseException, so the user's `except Exception` does not
    swallow it; and the timer fires again every REPEAT_S until disarmed, so one that is swallowed
    (a bare `except:` in a retry loop) is raised once more."""


REPEAT_S = 0.5
MIN_CALL_LIMIT_S = 0.01  # the shortest limit: a timer shorter than the handler's own run fires again inside it


def _raise(signum: int, frame: object) -> None:
    raise TransformTimeout


def arm(seconds: float) -> bool:
    """Start the limit for the call about to be made; False where none applies (<= 0, or off the
    main thread). Pair every True with `disarm()`."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGALRM) is not _raise:
        signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds, REPEAT_S)
    return True


def disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0, 0)


class CallLimit:
    """`seconds` on each of a run of calls, for two timer calls per run (`with limit:` around the
    run; `begin()`/`end()` around each call). A call outside a run is armed on its own (`arm`)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = False  # the run's timer is set
        self.started: float | None = None  # when the call under way began (time.monotonic)

    def __enter__(self) -> CallLimit:
        global _run
        if self.seconds > 0 and threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGALRM) is not _run_handler:
                signal.signal(signal.SIGALRM, _run_handler)
            _run, self.running = self, True
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        global _run
        if self.running:
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            _run, self.running, self.started = None, False, None

    def begin(self) -> bool:
        """A call starts. True: it was armed on its own (outside a run), and `end` disarms it."""
        if self.running:
            self.started = time.monotonic()
            return False
        return arm(self.seconds)

    def end(self, armed: bool) -> None:
        self.started = None
        if armed:
            disarm()


_run: CallLimit | None = None


def _run_handler(signum: int, frame: object) -> None:
    run = _run
    if run is None or not run.running:
        return
    if run.started is None:  # between calls: the next one has its whole limit
        signal.setitimer(signal.ITIMER_REAL, run.seconds)
        return
    left = run.seconds - (time.monotonic() - run.started)
    if left > 0:  # the timer counted earlier calls too: this one has time left
        signal.setitimer(signal.ITIMER_REAL, max(left, MIN_CALL_LIMIT_S))
        return
    signal.setitimer(signal.ITIMER_REAL, REPEAT_S)  # and again while the call goes on, as `arm` does
    raise TransformTimeout
