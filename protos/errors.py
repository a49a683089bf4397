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
