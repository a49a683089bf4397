"""A yes/no value as a setting, a TOML file or an environment variable spells it: one reading for
the command line's settings (stoker.settings) and the Loader's environment (accel.ranks), so that
`STOKER_INSECURE=perhaps` is refused the same way wherever it is read, not taken for "no"."""

from __future__ import annotations

from stoker.protos.errors import ConfigError

TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_switch(text: str, where: str) -> bool:
    """True or False; ConfigError naming `where` for anything else."""
    value = text.strip().lower()
    if value not in TRUE + FALSE:
        raise ConfigError(f"{where}: must be true or false (or 1 or 0), not {text!r}")
    return value in TRUE
