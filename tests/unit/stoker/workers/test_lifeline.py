"""stoker/workers/lifeline.py: a child dies with its parent, also when the parent is gone before it checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from stoker.workers.lifeline import parent_alive
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[4]
CHILD = "import sys, time\nfrom stoker.workers.lifeline import exit_with_parent\nexit_with_parent(int(sys.argv[1]))\n" \
        "print('alive', flush=True)\ntime.sleep(60)\n"


def test_parent_alive_knows_its_own_parent():
    assert parent_alive(os.getppid())
    assert not parent_alive(os.getppid() + 1)


def test_a_child_whose_parent_is_already_not_the_expected_one_terminates_itself():
    child = subprocess.run([sys.executable, "-c", CHILD, str(os.getpid() + 1)], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == -signal.SIGTERM and "alive" not in child.stdout


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its new parent to reap it counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_gets_sigterm_when_its_parent_dies():
    middle = ("import subprocess, sys\n"
              f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}, str(__import__('os').getpid())], "
              "stdout=subprocess.PIPE, text=True)\n"
              "assert child.stdout.readline() == 'alive\\n'\nprint(child.pid, flush=True)\n")  # then exits
    parent = subprocess.run([sys.executable, "-c", middle], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert parent.returncode == 0, parent.stderr
    child = int(parent.stdout.split()[0])
    assert wait_for(lambda: _gone(child), timeout=10), "the child outlived its parent"
