"""Children that die with their parent: a daemon with `stoker run`, a decode process with its daemon.

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) is sent when the *thread* that started
the child exits, not the process, and it is lost if the parent died before it was set. So
the child sets it itself (SIGTERM: drain and exit), then checks that its parent is still the
one it expects, and its loops keep checking `parent_alive()`: a re-parented child (getppid
changed) knows its parent process is gone, whichever of its threads started it.
"""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def exit_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its parent dies (now, if it already has)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the getppid checks still hold
        pass
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid
