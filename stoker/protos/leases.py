"""Lease tokens: only the worker process that leased a unit may send that unit's batches.

The dispatcher signs every lease it hands out: an HMAC over (job, unit, host, worker, key
name) with a key made with the job. The worker echoes the token in its hello and in every
batch of the unit; the consumer, which holds the same key (in-process, or from its attach
reply), checks it before a batch goes anywhere. A process that never leased the unit, or
leased it under another worker id or another CURVE key, cannot produce a valid token, so it
can neither claim a sender slot nor inject a batch. Tokens are deterministic, so a
dispatcher restarted from its journal (which keeps the key) answers with the same ones.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import signal
from dataclasses import dataclass

KEY_BYTES = 32
TOKEN_BYTES = 16
# Why a worker process gives a unit back while it lives (nothing lost; the unit is simply made by whoever leases it):
TRADED = "traded"  # an earlier unit of the same rank was pending: the dispatcher gave it in the held one's place
UNREACHABLE = "consumer unreachable"  # the rank's data socket stopped answering (it restarted, or cannot be reached)
HANDED_BACK = frozenset({TRADED, UNREACHABLE})
# Why the consumer has a unit made again: its leaseholder's last batch left samples of it out.
SHORT_UNIT = "short_unit"
# A host registered again (its daemon started, or came back to the job): its processes hold nothing.
REREGISTERED = "host registered again"
HOST_ID_IN_USE = "is in use by a live daemon"  # a register refused: another daemon heartbeats under that host id
# The release reasons a metric may carry as a label: a reason is a peer's free text, and a label value is a
# series for ever, so any other reason counts as "other" (the log line keeps the text). A daemon names a
# process's death by its exit code or the signal that killed it: those are in the set, each spelt once.
RELEASE_LABELS = frozenset({
    TRADED, UNREACHABLE, SHORT_UNIT, REREGISTERED, "released", "connection_closed", "host_timeout", "lease_expired",
    "host draining", "lease refused", "moved to another job", "process could not start a thread",
    *(f"process exit {code}" for code in range(256)), *(f"process exit {sig.name}" for sig in signal.Signals),
    *(f"process exit signal {number}" for number in range(1, 65))})


def release_label(reason: str) -> str:
    """The label value a release reason counts under: one of a closed set, "other" for anything else."""
    return reason if reason in RELEASE_LABELS else "other"


@dataclass(frozen=True)
class LeaseSigner:
    """Signs and checks lease tokens with the job's key: a batch is taken only from the process
    that holds the unit's lease."""

    key: bytes
    job_id: str

    @classmethod
    def new(cls, job_id: str) -> LeaseSigner:
        """A signer with a fresh random key, for a new job."""
        return cls(secrets.token_bytes(KEY_BYTES), job_id)

    def token(self, unit_id: int, host_id: str, worker_id: str, key_name: str = "") -> bytes:
        """`key_name`: the worker's CURVE key (its User-Id name), "" without keys."""
        message = "\0".join((self.job_id, str(unit_id), host_id, worker_id, key_name)).encode()
        return hmac.new(self.key, message, hashlib.sha256).digest()[:TOKEN_BYTES]

    def valid(self, token: bytes, unit_id: int, host_id: str, worker_id: str, key_name: str = "") -> bool:
        """The token is the one `token` makes for these (compared in constant time)."""
        return len(token) == TOKEN_BYTES and hmac.compare_digest(
            token, self.token(unit_id, host_id, worker_id, key_name))
