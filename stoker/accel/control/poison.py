"""Samples that kill or hang the process transforming them: counted, and skipped once they are poison.

One death may be bad luck (an OOM kill elsewhere); POISON_CRASHES deaths on the same sample are
the sample. A transform that runs past --transform-timeout is poison at once: that call was already
cut short and its sample skipped, so skipping it from then on keeps every epoch the same and costs
no second wait. Memory is bounded: at most CRASHES_KEPT samples are counted at once, so a flood
of random crashes cannot grow it, and at most POISON_KEPT are skipped (past that, a job whose
transform fails that often is better served by the error than by a longer list).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stoker.pipeline.units import Unit

POISON_CRASHES = 2  # a sample whose transform killed this many processes is skipped from then on
CRASHES_KEPT = 4096  # samples whose crashes are counted at once
POISON_KEPT = 65536  # samples skipped at once: reports under made-up sample ids cannot grow it past this


@dataclass
class PoisonList:
    _crashes: dict[int, int] = field(default_factory=dict)  # sample id -> processes it killed
    _poison: dict[int, str] = field(default_factory=dict)  # sample id -> why it is skipped unread
    hung_samples: int = 0  # samples made poison by a transform past its time limit
    hung_s: float = 0.0  # the seconds processes spent in those calls, every report counted (the bottleneck's)

    def crashed(self, sample_id: int, how: str) -> bool:
        """A worker process died transforming `sample_id` (`how`: its host, process and exit);
        True when that made the sample poison."""
        if sample_id in self._poison:
            return False
        count = self._crashes.get(sample_id, 0) + 1
        if count < POISON_CRASHES:
            if len(self._crashes) >= CRASHES_KEPT:
                self._crashes.pop(next(iter(self._crashes)))
            self._crashes[sample_id] = count
            return False
        self._crashes.pop(sample_id, None)
        return self._skip(sample_id, f"the transform killed {POISON_CRASHES} worker processes on it (last: {how})")

    def hung(self, sample_id: int, how: str, seconds: float) -> bool:
        """A transform ran `seconds` past its time limit on `sample_id` (`how`: where, and how long):
        skipped from now on. True when that made the sample poison (False: it already was)."""
        self.hung_s += max(0.0, min(seconds, 86400.0))
        if sample_id in self._poison:
            return False
        self._crashes.pop(sample_id, None)
        made = self._skip(sample_id, f"the transform ran past --transform-timeout on it ({how})")
        self.hung_samples += made
        return made

    def _skip(self, sample_id: int, why: str) -> bool:
        if len(self._poison) >= POISON_KEPT:
            return False
        self._poison[sample_id] = why
        return True

    def why(self, sample_id: int) -> str:
        """Why a poison sample is skipped ("" for one that is not)."""
        return self._poison.get(sample_id, "")

    def in_unit(self, unit: Unit) -> dict[int, str]:
        """The unit's poison samples, and why each is skipped."""
        return {sample_id: why for sample_id, why in self._poison.items()
                if any(g.first_sample_id + g.start <= sample_id < g.first_sample_id + g.stop for g in unit.segments)}
