"""stoker/pipeline/store/locks.py: flocks between processes (and descriptors), and a lock file its holder removes."""

from __future__ import annotations

import os
import threading

from stoker.pipeline.store.locks import acquire


def test_exclusive_excludes_and_shared_shares(tmp_path):
    path = tmp_path / "x.lock"
    first = acquire(path, exclusive=False)
    second = acquire(path, exclusive=False, wait=False)
    assert first is not None and second is not None
    assert acquire(path, exclusive=True, wait=False) is None  # another descriptor conflicts, even in this process
    first.release()
    second.release()
    held = acquire(path, exclusive=True, wait=False)
    assert held is not None and acquire(path, exclusive=False, wait=False) is None
    held.release()


def test_a_waiter_whose_lock_file_is_removed_locks_the_file_now_at_the_path(tmp_path):
    path = tmp_path / "x.lock"
    holder = acquire(path)
    got = []
    waiter = threading.Thread(target=lambda: got.append(acquire(path)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # waiting on the holder
    holder.release(remove=True)
    waiter.join(5)
    lock = got[0]
    assert os.stat(path).st_ino == os.fstat(lock._fd).st_ino  # on the live file, so it excludes the next one
    assert acquire(path, wait=False) is None
    lock.release()
