"""stoker/accel/ranks.py: who a rank is, where it listens, and how the ranks of a job meet."""

from __future__ import annotations

import pytest

from stoker.accel.consumer_config import ConsumerConfig
from stoker.accel.ranks import (
    Meeting,
    Place,
    RendezvousTimeout,
    TorchStore,
    default_config,
    made_too_early,
    meeting_key,
    node_address,
    place,
    rank_zero_dispatcher,
    route_to,
)
from stoker.protos.errors import ConfigError

TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "STOKER_HOST", "STOKER_KEYS",
            "STOKER_INSECURE")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)


def test_arguments_come_before_torchruns_environment(monkeypatch):
    assert place() == Place(0, 1, 0, "127.0.0.1")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert place() == Place(3, 8, 1, "10.0.0.1")
    assert place(rank=0, world_size=2).rank == 0 and place(rank=0, world_size=2).world_size == 2


def test_a_rank_outside_its_world_or_a_garbled_variable_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="rank 4 is not one of world size 2's ranks 0..1"):
        place(rank=4, world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "eight")
    with pytest.raises(ValueError, match=r"\$WORLD_SIZE='eight' is not a number"):
        place()


def test_an_initialised_process_group_names_the_rank_without_torchruns_variables():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert place() == Place(0, 1, 0, "127.0.0.1")
    finally:
        dist.destroy_process_group()


def test_a_job_on_one_machine_listens_on_loopback_and_one_across_machines_on_the_route(monkeypatch):
    assert node_address("127.0.0.1") == "127.0.0.1" and node_address("localhost") == "127.0.0.1"
    assert node_address("127.0.0.2") == "127.0.0.1"
    # the route to an address of this machine's own loopback network starts there
    assert route_to("127.0.0.5") in ("127.0.0.1", "127.0.0.5")
    monkeypatch.setenv("STOKER_HOST", "198.18.0.7")
    assert node_address("10.1.1.1") == "198.18.0.7"


def test_a_master_addr_that_does_not_resolve_names_the_settings_to_fix():
    with pytest.raises(ValueError, match=r"MASTER_ADDR='no-such-node.invalid' does not resolve.*\$STOKER_HOST"):
        route_to("no-such-node.invalid")


def test_the_default_config_reads_keys_and_insecure_from_the_environment(monkeypatch):
    cfg = default_config(Place(0, 2, 1, "127.0.0.1"))
    assert cfg.data_bind == "tcp://127.0.0.1:0" and cfg.control_bind.endswith(":5561")
    assert cfg.metrics_port == 9571 and cfg.keys is None and not cfg.insecure
    monkeypatch.setenv("STOKER_KEYS", "/keys")
    monkeypatch.setenv("STOKER_INSECURE", "1")
    cfg = default_config(Place(0, 2, 0, "127.0.0.1"))
    assert cfg.keys == "/keys" and cfg.insecure
    assert not default_config(Place(0, 2, 0, "127.0.0.1"), insecure=False).insecure  # the argument wins


def test_a_loaders_switch_in_the_environment_is_read_as_the_command_line_reads_it(monkeypatch):
    """STOKER_INSECURE=perhaps is refused by `stoker worker`; a Loader refuses it too, not reads it as no."""
    monkeypatch.setenv("STOKER_INSECURE", "perhaps")
    with pytest.raises(ConfigError, match=r"\$STOKER_INSECURE: must be true or false"):
        default_config(Place(0, 2, 0, "127.0.0.1"))
    monkeypatch.setenv("STOKER_INSECURE", "off")
    assert not default_config(Place(0, 2, 0, "127.0.0.1")).insecure


def test_without_a_store_a_rank_finds_rank_zero_at_master_addr():
    cfg = ConsumerConfig(control_bind="tcp://127.0.0.1:6001")
    assert rank_zero_dispatcher(cfg, 1, "10.0.0.1").dispatcher == "tcp://10.0.0.1:6001"
    assert rank_zero_dispatcher(cfg, 0, "10.0.0.1").dispatcher is None


def test_rank_zero_publishes_and_the_others_wait_in_the_store():
    import torch.distributed as dist

    store = TorchStore(dist.HashStore())
    key = meeting_key()
    assert meeting_key() != key  # the next loader meets under its own key
    with pytest.raises(RendezvousTimeout):
        store.fetch(key, 0.2)
    store.publish(key, Meeting("tcp://10.0.0.1:5561", "ab" * 32).encode())
    assert Meeting.decode(store.fetch(key, 1.0)) == Meeting("tcp://10.0.0.1:5561", "ab" * 32)


def test_a_rank_of_a_job_on_several_nodes_is_not_let_listen_on_loopback(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("STOKER_HOST", "127.0.0.1")
    where = place(rank=0)
    assert where.nodes_apart
    with pytest.raises(ValueError, match=r"on several nodes .* would listen on loopback .*\$STOKER_HOST"):
        default_config(where)


def test_ranks_that_disagree_on_keys_are_told_which_setting_to_match():
    with pytest.raises(ValueError, match=r"rank 0 uses CURVE keys, this rank has none.*\$STOKER_KEYS"):
        Meeting("tcp://10.0.0.1:5561", "", keyed=True).check(1, keyed=False)
    with pytest.raises(ValueError, match="rank 0 uses none"):
        Meeting("tcp://10.0.0.1:5561", "ab" * 32).check(1, keyed=True)
    Meeting("tcp://10.0.0.1:5561", "", keyed=True).check(1, keyed=True)


def test_a_world_size_without_a_rank_and_no_group_is_refused(monkeypatch):
    """PyTorch Lightning's launcher runs the script again with LOCAL_RANK and WORLD_SIZE but no RANK: a Loader
    made there took itself for rank 0 of 2, beside the real rank 0 (samples twice, then a hang)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ConfigError, match=r"\$WORLD_SIZE=2 is set but \$RANK is not, and no process group is "
                                          r"initialised: .*StokerDataModule does\), or give rank="):
        place()
    assert place(rank=1).rank == 1


def test_a_loader_made_before_its_process_group_is_told_when_the_group_says_otherwise(monkeypatch, tmp_path):
    """Made from torchrun-like variables (rank 1 of 2), then a group of one process: the group disagrees."""
    import torch.distributed as dist

    assert made_too_early(1, 2) is None  # no group: nothing to disagree with
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert made_too_early(0, 1) is None
        line = made_too_early(1, 2)
        assert line is not None and line.startswith("this Loader took itself for rank 1 of 2 when it was made, but "
                                                     "the process group now says rank 0 of 1")
    finally:
        dist.destroy_process_group()
