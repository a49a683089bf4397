"""Children that die with their parent: a daemon with `stoker run`, a decode process with its daemon.

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) is sent when the *thread* that started
the child exits, not the process, and it is lost if the parent died before it was set. So
the child sets it itself (SIGTERM: drain and exit; a decode process takes SIGKILL, since its
transform may be stuck where no signal handler runs, and with its daemon gone it has nobody
to drain for: its connection closes and its units are leased again), then checks that its parent is still the
one it expects, and its loops keep checking `parent_alive()`: a re-parented child (getppid
changed) knows its parent process is gone, whichever of its threads started it.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def exit_with_parent(parent_pid: int, signum: int = signal.SIGTERM) -> None:
    """Send this process `signum` when its parent dies (now, if it already has): SIGTERM to drain, or
    SIGKILL for a process that may be stuck where no handler runs (a transform inside C code)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the getppid checks still hold
        pass
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid
