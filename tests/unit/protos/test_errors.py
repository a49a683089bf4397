"""protos/errors.py: every error Stoker defines derives from stoker.StokerError and keeps its builtin kind."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import stoker
from stoker import ConfigError, JobConfig, StokerError


def stoker_errors() -> list[type[BaseException]]:
    """Every public exception class defined in a module of the installed `stoker` namespace."""
    found = []
    for info in pkgutil.walk_packages(stoker.__path__, "stoker."):
        if info.name.endswith("__main__"):  # runs the command line when imported
            continue
        module = importlib.import_module(info.name)
        found += [cls for _, cls in inspect.getmembers(module, inspect.isclass) if issubclass(cls, BaseException)
                  and cls.__module__ == info.name and not cls.__name__.startswith("_")]
    return found


def test_every_error_stoker_defines_has_the_one_root():
    errors = stoker_errors()
    assert len(errors) >= 30  # the walk saw the rooms, not just the top package
    outside = [f"{cls.__module__}.{cls.__name__}" for cls in errors if not issubclass(cls, StokerError)]
    # the one exception: a transform's deadline is a BaseException so that the user's own `except
    # Exception` in a transform cannot swallow it, and it never reaches a user
    assert outside == ["stoker.pipeline.deadline.TransformTimeout"]


def test_each_keeps_the_builtin_kind_it_had_so_older_handlers_still_catch_it():
    from stoker.pipeline.storage import StorageError
    from stoker.protos.framing import FrameError

    assert issubclass(StorageError, OSError) and issubclass(FrameError, ValueError)
    assert issubclass(stoker.JobFailed, RuntimeError) and issubclass(ConfigError, ValueError)


def test_a_config_that_cannot_work_is_a_config_error_a_user_catches_at_the_root():
    with pytest.raises(StokerError, match="batch size"):
        JobConfig(manifest_uri="unused", batch_size=0)
