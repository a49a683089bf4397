"""Where every benchmark leaves its figures: benchmarks/results/NAME.json (all of them, with the
machine and versions they ran with) and NAME.md (the table the pages under docs/ quote).

A figure measured on a shared cloud vCPU is only as good as the core it ran on: `CoreWatch`
records how much of a pinned core went to other processes or to the hypervisor (steal) while
it was measured, and `header` records the CPU and a fixed reference workload, so figures of
different days can be told apart from a change in the code."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from stoker.machine import cpu_model

RESULTS = Path(__file__).parent / "results"
SHARED_WARNING = 0.05  # a core that gave more than this share to others is reported as shared


def write_results(name: str, result: dict, table: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    (RESULTS / f"{name}.md").write_text(table)


def versions(*distributions: str) -> dict[str, str]:
    """The installed versions a figure was measured with (see requirements.lock), plus libzmq's."""
    found = {name: importlib.metadata.version(name) for name in ("numpy", "pyarrow", "pyzmq", *distributions)}
    import zmq

    return found | {"libzmq": zmq.zmq_version()}


def reference_rate(seconds: float = 0.3) -> float:
    """Loops/s of a fixed pure-Python workload on the calling thread's cores: a yardstick for the
    interpreter-bound benchmarks (text), so a slower or busier machine shows up beside the figure."""
    loops, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        total = 0
        for i in range(1000):
            total += i * i % 7
        loops += 1
    return loops / seconds


def header(name: str, *distributions: str) -> dict:
    """The fields every results file starts with."""
    return {"benchmark": name, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "cpu": cpu_model(), "reference_loops_per_s": reference_rate(), "versions": versions(*distributions)}


def _core_jiffies(core: int) -> tuple[int, int]:
    """(busy, steal) clock ticks of one core since boot, from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{core} "):
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in line.split()[1:9])
            return user + nice + system + irq + softirq, steal
    raise ValueError(f"no cpu{core} in /proc/stat")


@dataclass
class CoreWatch:
    """Context manager around an in-process measurement pinned to `core`: afterwards `others_share`
    is the share of the wall time the core spent on other processes (a neighbour pinned to the
    same core halves a figure), and `steal_share` the share the hypervisor took."""

    core: int
    own_share: float = field(default=0.0, init=False)  # our own CPU time over the wall time
    others_share: float = field(default=0.0, init=False)
    steal_share: float = field(default=0.0, init=False)

    def __enter__(self) -> CoreWatch:
        self._tick = os.sysconf("SC_CLK_TCK")
        self._start = (_core_jiffies(self.core), time.process_time(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        (busy0, steal0), own0, wall0 = self._start
        busy1, steal1 = _core_jiffies(self.core)
        wall = time.perf_counter() - wall0
        core_busy = (busy1 - busy0) / self._tick
        own = time.process_time() - own0
        self.own_share = own / wall
        self.others_share = max(0.0, core_busy - own) / wall
        self.steal_share = (steal1 - steal0) / self._tick / wall
        if self.others_share > SHARED_WARNING or self.steal_share > SHARED_WARNING:
            print(f"warning: core {self.core} was shared while measured: {100 * self.others_share:.0f}% to other "
                  f"processes, {100 * self.steal_share:.0f}% stolen by the hypervisor; the figure is low by "
                  "about that share", flush=True)

    def as_dict(self) -> dict[str, float]:
        return {"others_share": self.others_share, "steal_share": self.steal_share}
