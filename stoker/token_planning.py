"""`stoker plan --dataset tokens`: host cores and storage to feed language-model accelerators, in tokens.

The model is planning.py's, counted in tokens: one accelerator consumes `A` tokens/s when never waiting (a
profile's language-model rate, accel.backends.profiles: Llama 3.1 8B pretraining), a host core supplies `r`
tokens per CPU-second (`stoker calibrate`'s `tokens` entry: token shards read whole and packed into rows),
so N accelerators need ceil((1 - s) N A / r) cores for a stall below `s`. They read `b` bytes per token
(the token set's shards over its tokens), N A b bytes/s when never waiting. A store that gives the job
`S` bytes/s delivers at most S / b tokens/s: below (1 - s) N A, storage, not CPU, is the limit, and no
number of cores meets the stall target. A set of token shards read as it is measured; tokenizing online as
well (`stoker prepare tokens --online`) costs a core 1/r + 1/t CPU-seconds per token, `t` the tokenizer's own
rate (`stoker calibrate`'s `tokenize`). A calibration of an online set has the tokenizer in `r` already.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from stoker.accel.backends.profiles import token_rate
from stoker.accel.cost import rate_figure
from stoker.planning import SYSTEMS
from stoker.protos.errors import ConfigError

MB = 1e6  # --storage-mbps counts megabytes of 10^6 bytes, as storage is sold


@dataclass(frozen=True)
class TokenPlanInput:
    system: str
    per_core_rate: float  # tokens per CPU-second one host core supplies
    bytes_per_token: float  # what the job reads of its token shards per token
    accelerators: int = 8  # N: the plan answers for one system and for N
    stall_target: float = 0.02
    storage_mbps: float | None = None  # MB/s the job's store gives all its hosts together; None: not limited
    tokenize_rate: float | None = None  # tokens per CPU-second of the tokenizer alone, where measured
    online: bool = False  # per_core_rate was measured on an online set: tokenizing is in it already


@dataclass(frozen=True)
class TokenFeed:
    """What `count` systems need, and what they get."""

    count: int
    consumed: float  # tokens/s the accelerators take when never waiting
    cores: int  # host cores for a stall below the target, CPU alone
    delivered: float  # tokens/s, the least of the accelerators, those cores and the store
    cpu_stall: float  # with those cores, the store not counted
    stall: float  # with those cores and the store
    storage_mbps: float  # MB/s read at the delivered rate
    storage_bound: bool  # the store gives less than (1 - stall target) of what they consume
    useful_cores: int  # storage bound: the cores beyond these wait for reads; else `cores`
    cores_online: int | None  # tokenizing online too, where the tokenizer's rate is known


@dataclass(frozen=True)
class TokenPlan:
    system: str
    model: str
    accel_rate: float  # tokens/s of one system when never waiting
    per_core_rate: float
    bytes_per_token: float
    storage_limit_mbps: float | None
    feeds: tuple[TokenFeed, ...]
    source: str
    online: bool = False  # the per-core rate is of an online set (the workers tokenize)

    def as_dict(self) -> dict:
        return asdict(self)


def _feed(inp: TokenPlanInput, count: int, rate: float) -> TokenFeed:
    consumed = count * rate
    cores = math.ceil((1 - inp.stall_target) * consumed / inp.per_core_rate - 1e-9)
    cpu = min(consumed, cores * inp.per_core_rate)
    stored = math.inf if inp.storage_mbps is None else inp.storage_mbps * MB / inp.bytes_per_token
    bound = stored < (1 - inp.stall_target) * consumed
    delivered = min(cpu, stored)
    online = None
    if inp.tokenize_rate and not inp.online:
        both = 1 / (1 / inp.per_core_rate + 1 / inp.tokenize_rate)
        online = math.ceil((1 - inp.stall_target) * consumed / both - 1e-9)
    return TokenFeed(count=count, consumed=consumed, cores=cores, delivered=delivered, cpu_stall=1 - cpu / consumed,
                     stall=1 - delivered / consumed,
                     storage_mbps=delivered * inp.bytes_per_token / MB, storage_bound=bound,
                     useful_cores=math.ceil(stored / inp.per_core_rate - 1e-9) if bound else cores,
                     cores_online=online)


def make_token_plan(inp: TokenPlanInput) -> TokenPlan:
    if not inp.per_core_rate > 0 or not inp.bytes_per_token > 0:
        raise ConfigError("the per-core rate and the bytes per token must be positive (measure them with `stoker "
                          "calibrate`)")
    if not 0 <= inp.stall_target < 1:
        raise ConfigError(f"stall target {inp.stall_target} must lie in [0, 1)")
    if inp.system not in SYSTEMS:
        raise ConfigError(f"unknown system {inp.system!r} (choose {', '.join(SYSTEMS)})")
    if inp.accelerators < 1 or (inp.storage_mbps is not None and not inp.storage_mbps > 0):
        raise ConfigError("the accelerators must be 1 or more and the storage's MB/s positive")
    system = SYSTEMS[inp.system]
    lm = token_rate(system.profile)
    rate = lm.tokens_per_s * system.count
    counts = sorted({1, inp.accelerators})
    return TokenPlan(system=system.name, model=lm.model, accel_rate=rate, per_core_rate=inp.per_core_rate,
                     bytes_per_token=inp.bytes_per_token, storage_limit_mbps=inp.storage_mbps,
                     feeds=tuple(_feed(inp, count, rate) for count in counts), source=lm.source, online=inp.online)


def _mbps(value: float) -> str:
    return f"{value:,.1f}" if value >= 1 else f"{value:.2g}"


def describe_tokens(plan: TokenPlan) -> str:
    """The plan in words: cores and storage per count of systems, and where storage is the limit."""
    lines = [f"{plan.system} / tokens ({plan.model} pretraining): {plan.accel_rate:,.0f} tokens/s when fed; "
             f"{rate_figure(plan.per_core_rate)} tokens per CPU-second per host core; "
             f"{plan.bytes_per_token:.2f} bytes read per token"
             + (" (an online set: the workers' tokenizing is in the rate)" if plan.online else "")]
    for feed in plan.feeds:
        lines.append(f"  {feed.count} x {plan.system}: {feed.cores:,} host core(s) for stall "
                     f"{100 * feed.cpu_stall:.1f}%; storage reads {_mbps(feed.storage_mbps)} MB/s")
        if feed.cores_online is not None:
            lines.append(f"    tokenizing online instead (`stoker prepare tokens --online`; from the calibration's "
                         f"tokenize-only rate): {feed.cores_online:,} host core(s)")
        if feed.storage_bound and plan.storage_limit_mbps is not None:
            lines.append(f"    storage, not CPU, is the limit: {_mbps(plan.storage_limit_mbps)} MB/s gives "
                         f"{feed.delivered:,.0f} tokens/s of the {feed.consumed:,.0f} consumed, a stall of "
                         f"{100 * feed.stall:.1f}% whatever the cores; {feed.useful_cores:,} core(s) keep up with it "
                         f"and more wait for reads: a faster store, the shard cache, or fewer bytes per token")
    return "\n".join(lines)
