"""stoker/protos/errors.py: every error Stoker defines derives from stoker.StokerError and keeps its builtin kind."""

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


CATEGORIES = ("ConfigError", "DataError", "ResourceError", "NotFound", "PeerError", "StateError")


def test_each_error_sits_under_exactly_one_category_so_catching_a_category_catches_its_members():
    from stoker.protos import errors

    categories = [getattr(errors, name) for name in CATEGORIES]
    loose = [f"{cls.__module__}.{cls.__name__} {[c.__name__ for c in categories if issubclass(cls, c)]}"
             for cls in stoker_errors() if issubclass(cls, StokerError) and cls is not StokerError
             and cls not in categories and sum(issubclass(cls, c) for c in categories) != 1]
    assert loose == [], "derive each from the one category it belongs to (stoker/protos/errors.py)"


def test_what_a_peer_did_or_did_not_do_is_a_peer_error():
    from stoker.accel.ledger import InvalidBatch
    from stoker.accel.receive_loop import DispatcherSilent
    from stoker.protos.control_client import DispatcherUnreachable
    from stoker.protos.errors import PeerError
    from stoker.protos.framing import FrameError

    peers = (DispatcherUnreachable, DispatcherSilent, FrameError, InvalidBatch)
    assert all(issubclass(cls, PeerError) for cls in peers)


def test_each_keeps_the_builtin_kind_it_had_so_older_handlers_still_catch_it():
    from stoker.accel.ledger import InvalidBatch
    from stoker.accel.receive_loop import DispatcherSilent
    from stoker.pipeline.store.storage import StorageError
    from stoker.protos.framing import FrameError

    assert issubclass(StorageError, OSError) and issubclass(FrameError, ValueError)
    from stoker.accel.control.liveness import RankError

    assert issubclass(InvalidBatch, ValueError) and issubclass(DispatcherSilent, RuntimeError)
    assert issubclass(RankError, ValueError)
    assert issubclass(stoker.JobFailed, RuntimeError) and issubclass(ConfigError, ValueError)


def test_a_config_that_cannot_work_is_a_config_error_a_user_catches_at_the_root():
    with pytest.raises(StokerError, match="batch size"):
        JobConfig(manifest_uri="unused", batch_size=0)


# A builtin raised on purpose: a programming error of Stoker's own (a broken invariant, a method a
# subclass must write, a container's protocol), never a user's to catch and act on.
BUILTIN_RAISES_ALLOWED = {
    ("stoker/pipeline/store/record_sources.py", "NotImplementedError"): "the method each record source writes",
    ("stoker/pipeline/store/shards.py", "IndexError"): "a shard reader's __getitem__ (the sequence protocol)",
    ("stoker/pipeline/job_wire.py", "TypeError"): "a config field with no wire field, found at import",
    ("stoker/configured.py", "KeyError"): "an options dataclass named a field it does not have",
    ("stoker/pipeline/text/batching.py", "ValueError"): "a text unit spanning shards given to the one-shard path",
    ("stoker/pipeline/text/packing.py", "ValueError"): "the packer given a sequence its caller made too long",
    ("stoker/workers/multiproc.py", "RuntimeError"): "prometheus_client imported before its folder was set",
    ("stoker/workers/sender.py", "RuntimeError"): "a send without credit: the worker's loop broke its own rule",
    ("stoker/__init__.py", "AttributeError"): "the module's __getattr__ (the attribute protocol)",
    ("stoker/calibrate.py", "IsADirectoryError"): "caught on the next lines and raised as a ResourceError",
}
NOT_ERRORS = {"SystemExit", "KeyboardInterrupt", "GeneratorExit",  # how a process ends, not an error
              "StopIteration"}  # how an iterator ends (the protocol), not an error


def builtin_raises() -> list[tuple[str, str, int]]:
    """(module path, builtin exception, line) for every `raise Builtin(...)` in the product's code."""
    import ast
    import builtins
    from pathlib import Path

    root = Path(__file__).resolve().parents[4]
    found = []
    for path in sorted((root / "stoker").rglob("*.py")):  # the product: stoker/ and its rooms
        if path.name.endswith("_pb2.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            exc = node.exc if isinstance(node, ast.Raise) else None
            called = exc.func if isinstance(exc, ast.Call) else exc  # raise X(...) or raise X
            name = called.id if isinstance(called, ast.Name) else None
            if name and name not in NOT_ERRORS and isinstance(getattr(builtins, name, None), type) \
                    and issubclass(getattr(builtins, name), BaseException):
                found.append((str(path.relative_to(root)), name, node.lineno))
    return found


def test_stoker_raises_its_own_errors_not_bare_builtins():
    """`except stoker.StokerError` must catch every error a user can act on: a bare ValueError or
    OSError raised by Stoker would slip past it."""
    raises = builtin_raises()
    assert raises, "the walk found no raise at all: it read nothing"
    bare = [f"{path}:{line} raises {name}" for path, name, line in raises if (path, name) not in BUILTIN_RAISES_ALLOWED]
    assert bare == [], "raise a StokerError subclass (stoker/protos/errors.py) that keeps the builtin kind"
    stale = set(BUILTIN_RAISES_ALLOWED) - {(path, name) for path, name, _ in raises}
    assert not stale, f"allowed but no longer raised: {sorted(stale)}"
