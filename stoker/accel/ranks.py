"""Who this rank is in its job, where it listens, and how the ranks of one job meet.

Launchers say who a process is in their own ways: torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR), an initialised torch.distributed process group,
or an initialised jax.distributed (process index and count). `place` reads them, in that
order after the loader's own arguments.

A rank listens where the workers and the other ranks can reach it: on loopback when the job
lives on one machine (MASTER_ADDR is loopback), otherwise on the address of this node that
routes to MASTER_ADDR, or $STOKER_HOST when set (`node_address`). Beyond loopback the sockets
need CURVE keys ($STOKER_KEYS) or an explicit $STOKER_INSECURE=1 (accel.consumer_config).

The ranks also have to agree on what only rank 0 knows once it is up: where its dispatcher
listens and the job secret that proves a rank is one of the job's consumers. Both travel
through the launcher's own key-value store (`Rendezvous`: torch.distributed's rendezvous
store, or JAX's coordination service), which is made anew for every run of the job, so a
restarted job never reads the previous run's secret and no file is shared. Without an
initialised process group they come from $MASTER_ADDR and the control port, and from
$STOKER_JOB_SECRET or rank 0's file on this machine (protos.job_secret).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Protocol

from stoker.accel.consumer_config import ConsumerConfig, rank_metrics_port
from stoker.protos.curve import is_loopback
from stoker.protos.errors import ConfigError, PeerError
from stoker.protos.switches import parse_switch

HOST_ENV = "STOKER_HOST"  # this node's address, as the workers and the other ranks reach it
KEYS_ENV = "STOKER_KEYS"  # a CURVE key folder (stoker keys init) for every rank of the job
INSECURE_ENV = "STOKER_INSECURE"  # "1": listen beyond loopback without keys, on a network you trust


@dataclass(frozen=True)
class Place:
    """Where this process stands in its job, as the launcher's environment says."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str  # rank 0's node ("127.0.0.1" when nobody says)
    local_world_size: int | None = None  # ranks on this node, where the launcher says (torchrun)

    @property
    def nodes_apart(self) -> bool:
        """The launcher says the job's ranks are on more than one node."""
        return self.local_world_size is not None and self.local_world_size < self.world_size


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "")
    try:
        return int(text) if text else None
    except ValueError:
        raise ConfigError(f"${name}={text!r} is not a number") from None


def _launcher() -> tuple[int, int] | None:
    """(rank, world size) from an initialised torch.distributed or jax.distributed, if any (neither
    is imported here: a script that uses one has imported it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized():
        return jax.process_index(), jax.process_count()
    return None


def made_too_early(rank: int, world_size: int) -> str | None:
    """The line refusing a loader whose rank an initialised process group now contradicts (it was made before
    the group existed, as a script does that PyTorch Lightning's launcher runs again for each rank); None
    when they agree or there is no group."""
    launched = _launcher()
    if launched is None or launched == (rank, world_size):
        return None
    return (f"this Loader took itself for rank {rank} of {world_size} when it was made, but the process group now "
            f"says rank {launched[0]} of {launched[1]}: it was made before its launcher's process group existed "
            f"(PyTorch Lightning starts its ranks inside fit()); make it once the group exists "
            f"(stoker.lightning.StokerDataModule does)")


def place(rank: int | None = None, world_size: int | None = None, local_rank: int | None = None) -> Place:
    """Arguments first, then torchrun's environment, then an initialised torch.distributed or
    jax.distributed, then a single rank."""
    launched = _launcher()
    world = world_size if world_size is not None else _env_int("WORLD_SIZE")
    rank_ = rank if rank is not None else _env_int("RANK")
    if rank_ is None and world_size is None and launched is None and (world or 1) > 1:
        raise ConfigError(f"$WORLD_SIZE={world} is set but $RANK is not, and no process group is initialised: this "
                          f"process cannot tell which rank it is (PyTorch Lightning's own launcher says it only inside "
                          f"fit()); make the Loader once the process group exists (stoker.lightning.StokerDataModule "
                          f"does), or give rank=")
    if launched is not None:
        world = launched[1] if world is None else world
        rank_ = launched[0] if rank_ is None else rank_
    world = 1 if world is None else world
    rank_ = 0 if rank_ is None else rank_
    local = local_rank if local_rank is not None else _env_int("LOCAL_RANK")
    if world < 1 or not 0 <= rank_ < world:
        raise ConfigError(f"rank {rank_} is not one of world size {world}'s ranks 0..{world - 1}")
    return Place(rank_, world, rank_ if local is None else local, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                 _env_int("LOCAL_WORLD_SIZE"))


def node_address(master_addr: str) -> str:
    """Where this node's rank listens: $STOKER_HOST, else loopback for a job on one machine (MASTER_ADDR
    on loopback), else this node's address on the route to MASTER_ADDR (the network the job's
    nodes share)."""
    given = os.environ.get(HOST_ENV, "").strip()
    if given:
        return given
    if is_loopback(f"tcp://{master_addr}:0") or master_addr == "localhost":
        return "127.0.0.1"
    return route_to(master_addr)


def route_to(host: str) -> str:
    """This machine's address on the route to `host` (a UDP connect sends nothing; it only picks the
    interface). A name that does not resolve is an error that says which setting to fix."""
    try:
        family, _, _, _, target = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    except socket.gaierror as exc:
        raise ConfigError(f"MASTER_ADDR={host!r} does not resolve ({exc.strerror}): give rank 0's node address in "
                         f"$MASTER_ADDR (torchrun --master-addr), or this node's own in ${HOST_ENV}") from None
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(target)
        except OSError as exc:
            raise ConfigError(f"no route from this node to MASTER_ADDR={host} ({exc.strerror}): set ${HOST_ENV} "
                             f"to the address the job's nodes and workers reach this node at") from None
        address = probe.getsockname()[0]
    return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address


def rank_zero_dispatcher(cfg: ConsumerConfig, rank: int, master_addr: str) -> ConsumerConfig:
    """A rank other than 0 with no dispatcher named attaches to rank 0's: its control port at MASTER_ADDR
    (what a rank does when no launcher store tells it the endpoint)."""
    if not rank or cfg.dispatcher:
        return cfg
    return replace(cfg, dispatcher=f"tcp://{master_addr}:{cfg.control_bind.rsplit(':', 1)[1]}")


def default_config(where: Place, keys: str | None = None, insecure: bool | None = None) -> ConsumerConfig:
    """A rank's sockets when the script gives no ConsumerConfig: on this node's address (`node_address`),
    data on a free port, the dispatcher on the control port, /metrics per local rank; keys from the
    argument or $STOKER_KEYS, insecure from the argument or $STOKER_INSECURE."""
    host = node_address(where.master_addr)
    if where.nodes_apart and is_loopback(f"tcp://{host}:0"):
        raise ConfigError(f"rank {where.rank}: this job's {where.world_size} ranks are on several nodes "
                         f"($LOCAL_WORLD_SIZE={where.local_world_size}), but this rank would listen on loopback "
                         f"({host}: $MASTER_ADDR={where.master_addr}, ${HOST_ENV}={os.environ.get(HOST_ENV, '')!r}): "
                         f"give rank 0's node address in $MASTER_ADDR (torchrun --master-addr), or this node's own "
                         f"in ${HOST_ENV}")
    defaults = ConsumerConfig()
    return ConsumerConfig(data_bind=f"tcp://{host}:0",
                          control_bind=f"tcp://{host}:{defaults.control_bind.rsplit(':', 1)[1]}",
                          metrics_port=rank_metrics_port(where.local_rank),
                          keys=keys or os.environ.get(KEYS_ENV) or None,
                          insecure=env_flag(INSECURE_ENV) if insecure is None else insecure)


def env_flag(name: str) -> bool:
    """An environment variable read as a yes/no switch (unset or empty: no); ConfigError for a value that
    is neither, as the command line's settings refuse it."""
    text = os.environ.get(name, "")
    return parse_switch(text, f"${name}") if text.strip() else False


class Rendezvous(Protocol):
    """A key-value store every rank of this run of the job reaches: rank 0 publishes, the others wait."""

    def publish(self, key: str, value: str) -> None:
        """Rank 0: make `value` readable under `key` by every rank."""
        ...

    def fetch(self, key: str, timeout_s: float) -> str:
        """The value under `key`, waiting up to `timeout_s` for rank 0 (RendezvousTimeout after)."""
        ...


class RendezvousTimeout(PeerError, TimeoutError):
    """Rank 0 published nothing under the key in the time given."""


class KeyStore(Protocol):
    """What TorchStore uses of a torch.distributed.Store."""

    def set(self, key: str, value: str) -> None:
        """Store `value` under `key`."""
        ...

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        """Block until every key is set (RuntimeError past `timeout`)."""
        ...

    def get(self, key: str) -> bytes:
        """The value under `key`, as bytes."""
        ...


class KeyValueClient(Protocol):
    """What JaxStore uses of jax.distributed's coordination-service client."""

    def key_value_set(self, key: str, value: str) -> None:
        """Store `value` under `key` in the coordination service."""
        ...

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
        """The value under `key`, waiting up to `timeout_in_ms` for it."""
        ...


@dataclass(frozen=True)
class TorchStore:
    """torch.distributed's rendezvous store (torchrun makes a new one for every run and restart)."""

    store: KeyStore

    def publish(self, key: str, value: str) -> None:
        """Rendezvous.publish on torch's store."""
        self.store.set(key, value)

    def fetch(self, key: str, timeout_s: float) -> str:
        """Rendezvous.fetch on torch's store."""
        try:
            self.store.wait([key], timedelta(seconds=timeout_s))
        except RuntimeError as exc:  # torch's DistStoreError on a timeout
            raise RendezvousTimeout(str(exc)) from None
        return self.store.get(key).decode()


@dataclass(frozen=True)
class JaxStore:
    """JAX's coordination service (jax.distributed.initialize), new for every run of the job."""

    client: KeyValueClient

    def publish(self, key: str, value: str) -> None:
        """Rendezvous.publish on JAX's coordination service."""
        self.client.key_value_set(key, value)

    def fetch(self, key: str, timeout_s: float) -> str:
        """Rendezvous.fetch on JAX's coordination service."""
        try:
            return self.client.blocking_key_value_get(key, int(timeout_s * 1000))
        except Exception as exc:  # jaxlib raises its own error type on a timeout
            raise RendezvousTimeout(str(exc)) from None


def rendezvous() -> Rendezvous | None:
    """The launcher's store, when this process has initialised torch.distributed or jax.distributed."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        from torch.distributed import distributed_c10d

        return TorchStore(distributed_c10d._get_default_store())
    jax = sys.modules.get("jax")
    if jax is not None and jax.distributed.is_initialized():
        from jax._src import distributed

        client = distributed.global_state.client  # not None: that is what is_initialized() checks
        if client is not None:
            return JaxStore(client)
    return None


@dataclass(frozen=True)
class Meeting:
    """What rank 0 tells the other ranks of its job: its dispatcher's control endpoint and, without
    keys, the job secret."""

    control: str
    secret: str = ""
    keyed: bool = False  # rank 0 uses CURVE keys: so must every rank

    def encode(self) -> str:
        """The meeting as the text rank 0 publishes."""
        return json.dumps({"control": self.control, "secret": self.secret, "keyed": self.keyed})

    @classmethod
    def decode(cls, text: str) -> Meeting:
        """A meeting from the text `encode` made."""
        data = json.loads(text)
        return cls(str(data["control"]), str(data.get("secret", "")), bool(data.get("keyed", False)))

    def check(self, rank: int, keyed: bool) -> None:
        """A rank that does not use keys where rank 0 does (or the other way round) cannot attach: say so."""
        if self.keyed and not keyed:
            raise ConfigError(f"rank {rank}: rank 0 uses CURVE keys, this rank has none: give it the same key folder "
                             f"(${KEYS_ENV} or Loader(keys=DIR)), with the consumer key the ranks attach with")
        if keyed and not self.keyed:
            raise ConfigError(f"rank {rank}: this rank has CURVE keys (${KEYS_ENV}) but rank 0 uses none: give every "
                             f"rank the same setting")


_meetings = 0  # loaders that met through the store in this process: every rank makes its loaders in one order


def meeting_key() -> str:
    """The store key of this process's next loader (the n-th loader of every rank meets under the same key)."""
    global _meetings
    _meetings += 1
    return f"stoker/loader-{_meetings}"
