"""stoker/workers/task_budget.py: the host says it is short at most every SHORT_SAID_EVERY_S, counts the tasks
of processes still starting, and forgets those that exited."""

from __future__ import annotations

import multiprocessing as mp
import time

from stoker.workers import task_budget
from stoker.workers.limits import Room
from stoker.workers.task_budget import TASKS_PER_PROCESS, TaskBudget


def test_being_short_is_said_once_then_at_most_every_so_often(monkeypatch):
    budget = TaskBudget()
    assert budget.say_short() and not budget.say_short()
    monkeypatch.setattr(task_budget, "SHORT_SAID_EVERY_S", 0.0)
    assert budget.say_short()


def test_a_process_starting_counts_the_tasks_it_will_still_take_until_it_exits():
    budget = TaskBudget()
    process = mp.get_context("spawn").Process(target=time.sleep, args=(0.5,))
    process.start()
    budget.started(process)
    assert 0 <= budget.starting_tasks() <= TASKS_PER_PROCESS
    process.join(30)
    assert budget.starting_tasks() == 0 and not budget._young  # exited: forgotten


def test_no_room_is_said_with_the_room_left_and_what_starting_processes_take(monkeypatch):
    budget = TaskBudget()
    monkeypatch.setattr(task_budget, "task_room", lambda: None)
    assert budget.no_room() is None and not budget.refused_a_task()
    tight = Room(tasks=TASKS_PER_PROCESS - 1, limit="pids")
    monkeypatch.setattr(task_budget, "task_room", lambda: tight)
    assert budget.no_room() == (tight, 0)
