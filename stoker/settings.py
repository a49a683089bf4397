"""A daemon's options from its command line, `STOKER_*` variables and a `--config` file, in that order.

What systemd units and Kubernetes pods expect of a daemon: `STOKER_PROCS=3` sets `--procs 3`
(`STOKER_` and the option's name, upper case, `-` as `_`), and `--config FILE` reads a TOML
table of the same names (`procs = 3`, `leave-after = 5.0`). A flag beats a variable, a variable
beats the file, the file beats the field's default. Each value goes through its flag's own
check, and a bad one is refused with where it came from. An empty variable is unset, as a blank
line of a systemd EnvironmentFile means. Values are never printed, only refused.

TOML because Python reads it without a package (tomllib), its numbers and booleans are typed,
and it is what a person writes by hand next to a systemd unit or in a ConfigMap.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import tomllib
from collections.abc import Mapping
from typing import Any

from stoker.configured import Option, options_of
from stoker.protos.errors import ConfigError, ResourceError
from stoker.protos.switches import FALSE, TRUE

PREFIX = "STOKER_"


class SettingError(ConfigError):
    """A value from a file or a variable that its option refuses: `where` says which."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")


def variable(option: Option) -> str:
    """`--leave-after` -> `STOKER_LEAVE_AFTER`."""
    return PREFIX + option.flag.lstrip("-").upper().replace("-", "_")


def key(option: Option) -> str:
    """The option's name in a config file: `leave-after`."""
    return option.flag.lstrip("-")


MAX_CONFIG_BYTES = 1 << 20  # a settings file is a few lines; /dev/zero is not one


def _regular_file(path: str, flags: int) -> int:
    """Open `path` without blocking (a FIFO with no writer would wait for ever) and only if it is a
    regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ResourceError(errno.EINVAL, "not a regular file (a FIFO, a device or a folder)")
    os.set_blocking(fd, True)
    return fd


def read_file(path: str, options: list[Option]) -> dict[str, Any]:
    """The file's settings by field name; a name that is no option here, or one that is not to be
    set from a file, is refused."""
    try:
        with open(path, "rb", opener=_regular_file) as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise SettingError(f"--config {path}", f"over {MAX_CONFIG_BYTES} bytes: not a settings file")
        table = tomllib.loads(data.decode())
    except OSError as exc:
        raise SettingError(f"--config {path}", exc.strerror or str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"--config {path}", f"not TOML: {exc}") from None
    except UnicodeDecodeError:
        raise SettingError(f"--config {path}", "not TOML: not UTF-8 text") from None
    except RecursionError:
        raise SettingError(f"--config {path}", "not TOML this reader takes: nested too deeply") from None
    by_key = {key(o): o for o in options if o.setting}
    found = {}
    for name, value in table.items():
        option = by_key.get(name.replace("_", "-"))
        name = name if name.isprintable() else repr(name)  # the error stays one line
        if option is None:
            raise SettingError(f"{path}", f"{name}: no such setting (these are: {', '.join(sorted(by_key))})")
        found[option.name] = _value(option, value, f"{path}: {name}")
    return found


def _value(option: Option, raw: Any, where: str) -> Any:
    """A value from a file (TOML-typed) or a variable (text), checked as the flag's is."""
    if option.switch:
        text = str(raw).lower() if not isinstance(raw, bool) else ("true" if raw else "false")
        if text not in TRUE + FALSE:
            raise SettingError(where, f"must be true or false (or 1 or 0), not {str(raw)!r}")
        return (text in TRUE) is not (option.field.default is True)  # a True default's flag turns it off
    if isinstance(raw, bool) or isinstance(raw, (dict, list)):
        raise SettingError(where, f"must be a single {option.kind.__name__} value, not {raw!r}")
    try:
        return option.parse(str(raw))
    except argparse.ArgumentTypeError as exc:
        raise SettingError(where, str(exc)) from None


def settle(cls: type, args: argparse.Namespace, environ: Mapping[str, str], config: str | None) -> None:
    """Fill every option of `cls` the command line left out (the parser was made `layered`) from
    `environ`, then the `config` file, then the field's default. Raises SettingError."""
    options = options_of(cls)
    from_file = read_file(config, options) if config else {}
    given = vars(args)
    for option in options:
        if option.name in given:
            continue
        text = environ.get(variable(option), "") if option.setting else ""
        if text:
            value = _value(option, text, f"${variable(option)}")
        else:
            value = from_file.get(option.name, option.default)
        setattr(args, option.name, value)


def without_settings(environ: Mapping[str, str], cls: type) -> dict[str, str]:
    """`environ` less the variables that would set an option of `cls`."""
    names = {variable(o) for o in options_of(cls) if o.setting}
    return {name: value for name, value in environ.items() if name not in names}
