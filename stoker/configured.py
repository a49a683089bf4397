"""Command-line options made from a config dataclass's fields, and the config made back from them.

A field is an option when its metadata has a help line; the field holds the option's one name,
default, help and check, so none of them is written twice:

    procs: int = field(default=1, metadata={"help": "decode processes (default %(default)s)", "check": "positive"})

| metadata | what it says |
|---|---|
| `help` | the help line; `%(default)s` is the field's default as the command line writes it |
| `flag` | the option's name, where it is not `--FIELD-NAME` (`--leave-after` for `leave_after_s`) |
| `dest` | its name in the parsed namespace, where it is not the field's (`accel` for `AccelSpec.kind`) |
| `always` | `command_line` writes it even at the field's default: the command's own default differs |
| `check` | the value check, by name in `stoker.flags.CHECKS` (the configs' packages sit below the CLI) |
| `choices`, `metavar` | as argparse takes them |
| `off` | the command-line value that stands for None (a port's -1) |
| `hidden` | an option a parent process passes, left out of --help |
| `setting` | False: never read from a --config file or a `STOKER_*` variable (stoker.settings) |
| `options` | True on a field that holds a frozen config of its own: its options are this config's too, made |
|  | back into one value of it (`ConsumerConfig.seat`, a `FleetSeat`: `--fleet`, `--weight`, ...) |

A bool field is a switch: `--FLAG` sets a False default, and a True default is turned off by its
`flag` (`--no-overlap` for `overlap`). The parsed namespace holds each option under its field's name.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, dataclass, fields, replace
from enum import StrEnum
from typing import Any

from stoker.flags import CHECKS

T = typing.TypeVar("T")


@dataclass(frozen=True)
class Option:
    """One field as an option: how it is spelt, read and shown."""

    field: Field
    flag: str
    kind: type  # the field's type without None: bool, int, float, str, tuple
    within: str | None = None  # the field of the config that holds this option's own config (an `options` field)

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def dest(self) -> str:
        """Its name in the parsed namespace."""
        return self.field.metadata.get("dest", self.field.name)

    @property
    def meta(self) -> typing.Mapping[str, Any]:
        return self.field.metadata

    @property
    def switch(self) -> bool:
        return self.kind is bool

    @property
    def setting(self) -> bool:
        """Read from a file and the environment too (stoker.settings)."""
        return self.meta.get("setting", True)

    @property
    def default(self) -> Any:
        """The default as the command line holds it (None as `off`)."""
        if self.field.default is MISSING:
            return None
        if self.field.default is None and "off" in self.meta:
            return self.meta["off"]
        return self.field.default

    def parse(self, text: str) -> Any:
        """A value of this option from text (a flag's, a variable's); raises ArgumentTypeError."""
        if "check" in self.meta:
            value = CHECKS[self.meta["check"]](text)
        else:
            try:
                value = self.kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"must be {'an integer' if self.kind is int else 'a number'}, "
                                                 f"not {text!r}") from None
        choices = self.meta.get("choices")
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(map(str, choices))}, not {text!r}")
        return value

    def help(self, override: str | None = None, default: Any = None) -> str:
        """The flag's help, its default written in (`default`: this command's own, where it has one)."""
        if self.meta.get("hidden"):
            return argparse.SUPPRESS
        text = override or self.meta["help"]
        return text.replace("%(default)s", str(self.default if default is None else default)).replace("%", "%%")

    def to_field(self, value: Any) -> Any:
        """The command line's value as the config holds it."""
        if "off" in self.meta and value == self.meta["off"]:
            return None
        return value


def _kind(annotation: Any) -> type:
    """`int | None` -> int; `tuple[str, ...]` -> tuple; a StrEnum -> str (the command line reads and
    checks its values as text, and the config turns one into its member)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return str
    return typing.get_origin(annotation) or annotation


def _held(cls: type) -> dict[str, type]:
    """The fields of `cls` that hold a config whose options are its own (`options` in their metadata)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls) if f.metadata.get("options")}


def options_of(cls: type, only: Iterable[str] | None = None) -> list[Option]:
    """The fields of `cls` that are options (those with a help line), in field order, a held config's options
    in its field's place; `only`: these names (a held config's field: all its options)."""
    hints, held = typing.get_type_hints(cls), _held(cls)
    wanted = None if only is None else set(only)
    found = []
    for f in fields(cls):
        if wanted is not None and f.name not in wanted:
            continue
        if f.name in held:
            found += [replace(o, within=f.name) for o in options_of(held[f.name])]
        elif "help" in f.metadata:
            found.append(Option(f, f.metadata.get("flag", "--" + f.name.replace("_", "-")), _kind(hints[f.name])))
    missing = (wanted or set()) - {o.within or o.name for o in found}
    if missing:
        raise KeyError(f"{cls.__name__} has no option field {', '.join(sorted(missing))}")
    return found


def add_options(group: Any, cls: type, only: Iterable[str] | None = None, *, layered: bool = False,
                helps: dict[str, str] | None = None, defaults: dict[str, Any] | None = None,
                noted: bool = False) -> list[Option]:
    """Add `cls`'s options to a parser or argument group. `layered`: an option left out is absent
    from the namespace (stoker.settings fills it from a file, the environment or the default).
    `defaults`: this command's own default for a field, instead of the config's. `noted`: `was_given`
    tells whether the command line gave each (its default value included)."""
    made = options_of(cls, only)
    for option in made:
        extra: dict[str, Any] = {"dest": option.dest, "help": option.help((helps or {}).get(option.name),
                                                                          (defaults or {}).get(option.name))}
        if option.switch:
            extra["action"] = "store_false" if option.field.default is True else "store_true"
        else:
            extra |= {"type": _named(option),
                      "metavar": option.meta.get("metavar", option.flag.lstrip("-").upper().replace("-", "_"))}
            if option.meta.get("choices") and "check" not in option.meta:
                extra |= {"choices": option.meta["choices"], "type": option.kind}
        extra["default"] = argparse.SUPPRESS if layered else (defaults or {}).get(option.name, option.default)
        action = group.add_argument(option.flag, **extra)
        if noted:
            _noting_given(action)
    return made


GIVEN = "_options_given"  # the namespace's set of option dests the command line itself gave (`was_given`)


class _NotesGiven(argparse.Action):
    """Mixed into an option's own action: it also notes that the command line gave the option, so that one
    given at its default value is told from one left out (a flag that cannot apply to the job is refused
    even then: `--seq-len 128` on a tokens job)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {self.dest})
        super().__call__(parser, namespace, values, option_string)


_NOTING: dict[type, type] = {}


def _noting_given(action: argparse.Action) -> None:
    kind = type(action)
    action.__class__ = _NOTING.setdefault(kind, type(f"Noted{kind.__name__}", (_NotesGiven, kind), {}))


def was_given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the command line gave the option stored at `dest` (not its default, nor a file's value); only
    for options added `noted`."""
    return dest in getattr(args, GIVEN, frozenset())


def _named(option: Option) -> Callable[[str], Any]:
    """The option's parse, named as argparse names a type in its messages."""
    def parse(text: str) -> Any:
        return option.parse(text)

    parse.__name__ = option.meta.get("check", option.kind.__name__)
    return parse


def fields_of(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The parsed options that are fields of `cls`, as the config holds them. A command takes the
    options of a config it honours, or some of them (`add_options`' `only`): one it does not take
    is not in its namespace, and the field keeps its default."""
    given = vars(args)
    made = {o.name: o.to_field(given[o.dest]) for o in options_of(cls) if o.within is None and o.dest in given}
    for name, held in _held(cls).items():  # a held config, made whole from its options (and checked so)
        inner = fields_of(held, args)
        if inner:
            made[name] = held(**inner)
    return made


def command_line(config: Any) -> list[str]:
    """The flags that make `config` from its class's defaults, from the same field metadata the parser reads:
    the one way a child process (a `stoker run` host, a lab member, a loader's workers) is told its config.
    Each as FLAG=VALUE, so a value that starts with a dash is not taken for an option."""
    out = []
    for option in options_of(type(config)):
        value = getattr(getattr(config, option.within) if option.within else config, option.name)
        if value is None and "off" in option.meta:
            value = option.meta["off"]
        always = option.meta.get("always", False)
        if option.switch:
            if value != option.field.default:
                out.append(option.flag)  # store_true for a False default, store_false for a True one
        elif value is not None and (always or option.field.default is MISSING or value != option.default):
            out.append(f"{option.flag}={value!r}" if isinstance(value, float) else f"{option.flag}={value}")
    return out


def config_of(cls: type[T], args: argparse.Namespace, **extra: Any) -> T:
    """`cls` from the parsed options that are its fields (`fields_of`), and `extra` fields."""
    return cls(**(fields_of(cls, args) | extra))


def flag_of(cls: type, name: str) -> str | None:
    """The flag that gives `cls`'s field `name` (None: the field is no option)."""
    return next((o.flag for o in options_of(cls) if _said(o) == name), None)


def _said(option: Option) -> str:
    """How a config's own words name the option: its field, or a held config's option by its name in the
    parsed namespace (`fleet_key_name`: the seat's `key_name`, beside the consumer's own `key_name`)."""
    return option.dest if option.within else option.name


def as_flag_problem(cls: type, problem: str) -> str:
    """A config's own check's words (`stall_report_s (60) must be below stall_timeout_s (30)`, or
    `--drop-last applies to ...`) as the command line says them: `argument FLAG: ...`, FLAG the option of
    the field the problem starts with, and every field of `cls` named in it spelt as its flag."""
    problem = problem.removeprefix(f"{cls.__name__}: ")
    first = problem.split(" ", 1)[0].rstrip(":")
    if first.startswith("--") or problem.startswith(f"{first}:"):  # `FIELD: why`: the field said once, as the flag
        problem = problem[len(first):].lstrip(" :")
        if first.startswith("--"):
            return f"argument {first}: {problem}"
    flags = {_said(o): o.flag for o in options_of(cls)}
    said = problem
    for name in flags:  # a name with an underscore is no English word; the first word is the field's own
        if "_" in name or name == first:
            said = re.sub(rf"(?<![\w-]){name}(?![\w-])", flags[name], said)
    return f"argument {flags[first]}: {said}" if first in flags else said
