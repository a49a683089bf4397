"""stoker/settings.py: a daemon's options from flags, STOKER_* variables and a TOML file, in that order."""

from __future__ import annotations

import argparse

import pytest

from stoker.configured import add_options
from stoker.flags import Parser
from stoker.settings import SettingError, settle, without_settings
from tests.unit.stoker.test_configured import Demo


def settled(argv: list[str], environ: dict[str, str], config: str | None = None) -> argparse.Namespace:
    p = Parser(prog="demo")
    add_options(p, Demo, layered=True)
    args = p.parse_args(argv)
    settle(Demo, args, environ, config)
    return args


def test_a_flag_beats_a_variable_beats_the_file_beats_the_default(tmp_path):
    config = tmp_path / "demo.toml"
    config.write_text('procs = 5\nwait = 2.5\nmode = "b"\nno-overlap = true\n')
    args = settled(["--procs", "7"], {"STOKER_PROCS": "6", "STOKER_WAIT": "3"}, str(config))
    assert (args.procs, args.wait_s, args.mode, args.overlap, args.fast, args.port) == (7, 3.0, "b", False, False, -1)
    assert settled([], {"STOKER_PROCS": "6"}, str(config)).procs == 6
    assert settled([], {}, str(config)).procs == 5
    assert settled([], {}).procs == 2


def test_variables_name_the_flag_and_switches_read_as_people_write_them():
    args = settled([], {"STOKER_TO": "tcp://h:1", "STOKER_PORT": "-1", "STOKER_FAST": "yes", "STOKER_NO_OVERLAP": "1"})
    assert (args.endpoint, args.port, args.fast, args.overlap) == ("tcp://h:1", -1, True, False)
    assert settled([], {"STOKER_FAST": "0", "STOKER_PROCS": ""}).fast is False  # an empty variable is unset
    assert settled([], {"STOKER_PROCS": ""}).procs == 2


def test_a_file_may_spell_names_with_underscores(tmp_path):
    config = tmp_path / "demo.toml"
    config.write_text("no_overlap = true\nfast = false\n")
    args = settled([], {}, str(config))
    assert args.overlap is False and args.fast is False


@pytest.mark.parametrize("environ,text,where", [
    ({"STOKER_PROCS": "0"}, "", "$STOKER_PROCS: must be an integer >= 1, not '0'"),
    ({"STOKER_FAST": "maybe"}, "", "$STOKER_FAST: must be true or false (or 1 or 0), not 'maybe'"),
    ({}, "procs = 0\n", "demo.toml: procs: must be an integer >= 1, not '0'"),
    ({}, "procs = true\n", "demo.toml: procs: must be a single int value, not True"),
    ({}, 'mode = "c"\n', "demo.toml: mode: must be one of a, b, not 'c'"),
    ({}, "prcs = 3\n", "demo.toml: prcs: no such setting (these are: fast, mode, no-overlap, port, procs, to, wait)"),
    ({}, "procs = \n", "--config {path}: not TOML"),
])
def test_a_bad_value_says_where_it_came_from(tmp_path, environ, text, where):
    config = tmp_path / "demo.toml"
    config.write_text(text)
    with pytest.raises(SettingError) as refused:
        settled([], environ, str(config))
    assert where.format(path=config) in str(refused.value)


def test_a_file_that_is_not_utf8_or_holds_a_newline_in_a_key_is_one_line(tmp_path):
    config = tmp_path / "demo.toml"
    config.write_bytes(b"procs = 1\n\xff\xfe\n")
    with pytest.raises(SettingError, match="not TOML: not UTF-8 text"):
        settled([], {}, str(config))
    config.write_text('"procs\\nSECOND" = 1\n')  # a TOML key holding a newline
    with pytest.raises(SettingError) as refused:
        settled([], {}, str(config))
    assert "\n" not in str(refused.value) and "'procs\\nSECOND': no such setting" in str(refused.value)


def test_a_missing_file_is_named():
    with pytest.raises(SettingError, match="--config /no/such.toml: No such file"):
        settled([], {}, "/no/such.toml")


def test_the_environment_without_the_settings_keeps_everything_else():
    environ = {"STOKER_PROCS": "3", "STOKER_TO": "x", "STOKER_HOST": "h", "PATH": "/bin"}
    assert without_settings(environ, Demo) == {"STOKER_HOST": "h", "PATH": "/bin"}


def test_a_config_that_is_a_fifo_a_device_a_flood_or_deeply_nested_is_one_line_at_once(tmp_path):
    """A FIFO with no writer used to wait for ever, /dev/zero to fill memory, a deeply nested TOML to
    raise a traceback: each is refused with one line naming the file."""
    import os
    import time

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(SettingError, match="fifo.toml: not a regular file"):
        settled([], {}, str(fifo))
    assert time.monotonic() - started < 5
    with pytest.raises(SettingError, match="--config /dev/zero: not a regular file"):
        settled([], {}, "/dev/zero")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(SettingError, match="over 1048576 bytes"):
        settled([], {}, str(big))
    deep = tmp_path / "deep.toml"
    deep.write_text("procs = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(SettingError, match="nested too deeply|not TOML"):
        settled([], {}, str(deep))


def test_a_refused_setting_is_a_config_error():
    from stoker.protos.errors import ConfigError

    assert issubclass(SettingError, ConfigError) and issubclass(SettingError, ValueError)
