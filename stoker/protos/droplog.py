"""One way to count and log what a service refuses: a flood of junk must not become a flood of logs."""

from __future__ import annotations

import logging
from collections import Counter as Tally

from prometheus_client import Counter


class DropLog:
    """Counts each refusal by reason (in `counts`, and in `metric{reason=...}` when given) and logs
    the first `first` of each reason, then every `every`-th."""

    def __init__(self, log: logging.Logger, what: str, metric: Counter | None = None, first: int = 3,
                 every: int = 1000) -> None:
        self.log, self.what, self.metric, self.first, self.every = log, what, metric, first, every
        self.counts: Tally[str] = Tally()

    def __call__(self, reason: str, source: object, detail: str = "") -> int:
        count = self.counts[reason] = self.counts[reason] + 1
        if self.metric is not None:
            self.metric.labels(reason=reason).inc()
        if count <= self.first or count % self.every == 0:
            said = f" ({detail[:200]})" if detail else ""
            self.log.warning("dropped %s from %r: %s%s; %d so far", self.what, source, reason, said, count)
        return count
