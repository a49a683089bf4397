"""stoker/protos/switches.py: yes/no values read one way wherever they come from."""

from __future__ import annotations

import pytest

from stoker.protos.errors import ConfigError
from stoker.protos.switches import parse_switch


@pytest.mark.parametrize(("text", "value"), [("1", True), ("TRUE", True), (" yes ", True), ("on", True),
                                             ("0", False), ("false", False), ("No", False), ("off", False)])
def test_the_spellings_of_yes_and_no(text, value):
    assert parse_switch(text, "$X") is value


@pytest.mark.parametrize("text", ["perhaps", "", "2", "enabled"])
def test_anything_else_is_refused_naming_where_it_came_from(text):
    with pytest.raises(ConfigError, match=r"\$STOKER_INSECURE: must be true or false \(or 1 or 0\), not "):
        parse_switch(text, "$STOKER_INSECURE")
