"""Which of `stoker train`'s options say what the job is, read from the parser's own job group
(`stoker.options.JOB`: `JobConfig`'s and `TextConfig`'s fields and the options the job resolves), so
a job option added to the configs is a job option here too."""

from __future__ import annotations

import functools

MANIFEST = "--data"  # the job's manifest: `stoker train`'s own option, beside the group


@functools.cache
def job_flags() -> tuple[frozenset[str], frozenset[str]]:
    """The job's options that take a value, and its switches."""
    from stoker.options import JOB

    valued: set[str] = {MANIFEST}
    switches: set[str] = set()
    for action in JOB._actions:
        (switches if action.nargs == 0 else valued).update(action.option_strings)
    return frozenset(valued), frozenset(switches)


def step_options(train_args: list[str]) -> list[str]:
    """What a rank other than 0 takes of rank 0's options: how it steps, not what the job is."""
    valued, switches = job_flags()
    out, skip = [], False
    for arg in train_args:
        if skip:
            skip = False
        elif arg in valued:
            skip = True
        elif arg not in switches and arg.split("=", 1)[0] not in valued:
            out.append(arg)
    return out
