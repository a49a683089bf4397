"""The root of every error Stoker raises for a user to catch.

It lives on the floor (protos is imported by every room) so that each room's errors can derive
from it. Each error also keeps the builtin base that says what kind of failure it is (a
ValueError for a value that cannot work, an OSError for a file or a peer), so code that caught
those before still does; `except stoker.StokerError` catches all of Stoker's at once.
"""

from __future__ import annotations


class StokerError(Exception):
    """Any error of Stoker's that a user may catch and act on."""


class ConfigError(StokerError, ValueError):
    """A setting whose value cannot work (a config field, a flag, an environment variable): the
    message names it and says what it may be."""


class DataError(StokerError, ValueError):
    """Data or a file Stoker reads that cannot be used as it is (a manifest, a shard, a record
    file, a journal, a checkpoint, a metrics page): the message names it and what to do."""


class ResourceError(StokerError, OSError):
    """What the system refused (a port to bind, a file to write or lock, a namespace to enter):
    the message names it and the system's reason."""


class NotFound(StokerError, FileNotFoundError):
    """A file, folder or pattern Stoker was pointed at that is not there."""


class PeerError(StokerError, ConnectionError):
    """A peer that cannot be reached in time, or that answered what it should not have."""


class StateError(StokerError, RuntimeError):
    """A call at a moment it cannot run, or a part that stopped before it could answer."""
