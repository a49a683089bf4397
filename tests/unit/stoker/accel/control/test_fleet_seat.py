"""A job's ask of a fleet: one value (`FleetSeat`), checked once as it is made; what cannot work is said
in one line naming its field, whether a script makes it, a config holds it or the command line parses it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.control.dispatch_config import DispatchConfig
from stoker.accel.control.fleet_seat import FleetSeat, SeatError, asked_of
from stoker.cli import build_parser, check_args
from stoker.configured import command_line
from stoker.protos.errors import ConfigError

FLEET = "tcp://127.0.0.1:5570"

# (the seat's fields, the field refused, what the message says)
REFUSED = [
    (dict(weight=0), "weight", "weight must be a number from"),
    (dict(weight=-1), "weight", "weight must be a number from"),
    (dict(weight=float("nan")), "weight", "weight must be a number from"),
    (dict(weight=float("inf")), "weight", "weight must be a number from"),
    (dict(weight=True), "weight", "weight must be a number from"),
    (dict(weight="2"), "weight", "weight must be a number from"),
    (dict(weight=2e6), "weight", "weight must be a number from 1e-06 to 1e+06"),
    (dict(min_cores=-1), "min_cores", "min_cores must be an integer from 0 to 1e+06"),
    (dict(min_cores=1.5), "min_cores", "min_cores must be an integer from 0 to 1e+06"),
    (dict(min_cores=2**32), "min_cores", "min_cores must be an integer from 0 to 1e+06"),  # past the wire's uint32
    (dict(max_cores=10**30), "max_cores", "and at most 1e+06"),
    (dict(key_name=""), "key_name", "key_name must be a key's name"),
    (dict(key_name="../../x"), "key_name", "key_name must be a key's name"),
    (dict(key_name=5), "key_name", "key_name must be a key's name"),
    (dict(fleet="tcp://127.0.0.1:*"), "fleet", "must be where a peer listens"),
    (dict(fleet="tcp://*:5570"), "fleet", "must be where a peer listens"),
    (dict(fleet="tcp://127.0.0.1:0"), "fleet", "must be where a peer listens"),
    (dict(min_cores=3, max_cores=2), "max_cores", "max_cores must be an integer of at least min_cores (3)"),
    (dict(max_cores=0), "max_cores", "at least min_cores (0) and 1"),
    (dict(start_cores=0), "start_cores", "start_cores must be a number above 0 and at most 1e+06"),
    (dict(start_cores=2e6), "start_cores", "start_cores must be a number above 0 and at most 1e+06"),
    (dict(fleet="not an endpoint"), "fleet", "fleet must be an endpoint"),
]


@pytest.mark.parametrize("given,name,says", REFUSED)
def test_each_value_that_cannot_work_is_refused_as_the_seat_is_made_naming_its_field(given, name, says):
    with pytest.raises(SeatError, match=re.escape(says)) as refused:
        FleetSeat(**({"fleet": FLEET} | given))
    assert refused.value.field == name and isinstance(refused.value, ConfigError)


def test_an_ask_without_a_fleet_is_refused():
    with pytest.raises(SeatError, match="no endpoint was given to ask") as refused:
        FleetSeat(weight=2.0)
    assert refused.value.field == "fleet"
    assert FleetSeat() == FleetSeat(None, 1.0, 0, None, "job", None)
    assert FleetSeat(FLEET, 2.5, 1, 4).max_cores == 4


@pytest.mark.parametrize("config", [ConsumerConfig, DispatchConfig])
def test_a_config_holds_one_seat_and_reaches_the_same_refusal(config):
    assert config().seat == FleetSeat()
    assert config(seat=FleetSeat(FLEET, weight=3.0)).seat.weight == 3.0
    with pytest.raises(SeatError, match="weight must be a number from") as refused:
        config(seat=FleetSeat(FLEET, weight=0.0))
    assert refused.value.field == "weight"


def test_a_consumer_config_refuses_a_seat_that_is_not_one():
    with pytest.raises(ConfigError, match="seat must be a FleetSeat"):
        ConsumerConfig(seat={"fleet": FLEET})


@pytest.mark.parametrize("argv,says", [
    (["--weight", "2e6"], "argument --weight: --weight must be a number from 1e-06 to 1e+06"),
    (["--min-cores", "3", "--max-cores", "2"], "argument --max-cores: --max-cores must be an integer of at least "
                                               "--min-cores (3) and 1, and at most 1e+06, not 2"),
    (["--fleet-start-cores", "2e6"], "argument --fleet-start-cores: --fleet-start-cores must be a number above 0"),
])
@pytest.mark.parametrize("command", [["train", "--data", "x"], ["run"], ["dispatch", "--data", "x"]])
def test_the_command_line_says_the_seat_s_refusal_as_the_flag(command, argv, says, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    parser = build_parser()
    args = parser.parse_args([*command, "--fleet", FLEET, *argv])
    with pytest.raises(SystemExit) as exited:
        check_args(parser, args)
    line = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and f"{command[0]}: {says}" in line and len(line.splitlines()) == 1, line


def test_stoker_train_refuses_a_weight_of_zero_naming_the_flag():
    done = subprocess.run([sys.executable, "-m", "stoker", "train", "--fleet", FLEET, "--weight", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "argument --weight" in done.stderr, done.stderr


def test_the_flags_make_the_seat_and_a_child_is_told_it_by_them(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    seat = FleetSeat(FLEET, 2.5, 1, 4, "resnet", 3.0)
    argv = command_line(ConsumerConfig(seat=seat))
    assert argv == [f"--fleet={FLEET}", "--weight=2.5", "--min-cores=1", "--max-cores=4", "--fleet-key-name=resnet",
                    "--fleet-start-cores=3.0"]
    from stoker import options

    args = build_parser().parse_args(["train", "--data", "x", *argv])
    assert options.consumer_config(args).seat == seat


def test_the_registration_is_the_seat_s_wire_form_and_reads_back():
    seat = FleetSeat(FLEET, 2.0, 1, 4)
    registration = seat.registration("job-1", "tcp://10.0.0.2:5561", "train")
    assert (registration.job_id, registration.endpoint, registration.transform) == ("job-1", "tcp://10.0.0.2:5561",
                                                                                   "train")
    assert asked_of(registration) == (2.0, 1, 4) and not registration.leaving
    assert asked_of(FleetSeat(FLEET).registration("j", "tcp://a:1")) == (1.0, 0, None)  # no max: absent on the wire
    leaving = seat.registration("job-1", "tcp://10.0.0.2:5561", leaving=True)
    assert leaving.leaving and leaving.weight == 2.0 and not leaving.min_cores and not leaving.HasField("max_cores")


PRODUCT = Path(__file__).resolve().parents[5] / "stoker"
ALLOWED = {PRODUCT / "accel/control/fleet_seat.py", PRODUCT / "accel/fleet/allocation.py"}


def test_no_other_module_checks_the_seat_again():
    """The weight's limits are compared in the seat's one check and in the fleet's own policy, nowhere else."""
    compared = re.compile(r"(<=?|>=?)\s*(MIN_WEIGHT|MAX_WEIGHT)\b|\b(MIN_WEIGHT|MAX_WEIGHT)\s*(<=?|>=?)")
    for path in PRODUCT.rglob("*.py"):
        if path not in ALLOWED:
            assert not compared.search(path.read_text()), path
            assert "fleet_problem" not in path.read_text(), path


def test_every_seat_that_is_made_goes_on_the_wire():
    """What the seat's check lets through, the wire carries: the largest asks it allows fit the message."""
    most = FleetSeat(FLEET, weight=1e6, min_cores=10**6, max_cores=10**6, key_name="job-1_a", start_cores=1e6)
    wire = most.registration("j", "tcp://127.0.0.1:5561")
    assert wire.SerializeToString() and (wire.min_cores, wire.max_cores) == (10**6, 10**6)
