"""What a rank reports of itself, read from its parts: the counters the bottleneck monitor windows
(`Totals`) and the books a summary closes with (`Books`). Functions of the parts, so that the rank's
class only says which parts it has."""

from __future__ import annotations

import time

from stoker.accel.bottleneck import Totals
from stoker.accel.control.dispatcher import DispatcherStats
from stoker.accel.ledger import Ledger
from stoker.accel.receiver import Receiver
from stoker.accel.summary import Books
from stoker.pipeline.job import JobConfig


def rank_totals(progress: Totals, receiver: Receiver | None, queue_depth: int, job: JobConfig, machine: str,
                hung_s: float) -> Totals:
    """A snapshot: the training loop's running counters plus what the workers reported with their batches."""
    p, stages = progress, receiver.stages if receiver else None
    if stages is None:
        return Totals(at=time.monotonic(), stall_s=p.stall_s, step_s=p.step_s, copy_s=p.copy_s, rows=p.rows,
                      batches=p.batches, queue_depth=queue_depth, consumer_cpu_s=time.process_time(),
                      consumer_machine=machine, hung_s=hung_s)
    work = {name: getattr(stages, name) for name in job.kind.stages} | {"send": stages.send}
    return Totals(at=time.monotonic(), stall_s=p.stall_s, step_s=p.step_s, copy_s=p.copy_s, rows=p.rows,
                  batches=p.batches, received_batches=stages.batches, transit_s=stages.transit,
                  min_transit_s=stages.min_transit, wait_for_credit_s=stages.wait_for_credit, work_s=work,
                  queue_depth=queue_depth, cpu_s=stages.cpu, cpu_wait_s=stages.cpu_wait,
                  throttled_wait_s=stages.throttled_wait, cpu_wait_batches=stages.cpu_wait_batches,
                  read_wait_s=stages.read_wait, host_cpu_s=dict(stages.host_cpu),
                  host_cpu_wait_s=dict(stages.host_cpu_wait), host_cores=dict(stages.host_cores),
                  host_procs=dict(stages.host_procs), host_machine=dict(stages.host_machine),
                  consumer_cpu_s=time.process_time(), consumer_machine=machine, hung_s=hung_s)


def rank_books(ledger: Ledger, receiver: Receiver, epochs: int, dispatch: DispatcherStats) -> Books:
    """The books of the first `epochs` epochs, as a summary reports them."""
    return Books(samples=ledger.samples, unique_samples=ledger.unique_samples, duplicates=ledger.duplicate_samples,
                 skipped=sorted(ledger.skipped.values(), key=lambda s: (s.epoch, s.sample_id)),
                 per_epoch_unique=[ledger.unique_in_epoch(e) for e in range(epochs)],
                 stages=receiver.stages, hosts=len(receiver.hosts_delivered), frames_dropped=dict(receiver.dropped),
                 bytes_received=receiver.bytes_received, text=receiver.text, dispatch=dispatch)
