"""What the control sockets (the dispatcher's, accel.control.serving.server, and the fleet's,
accel.fleet.service) share on the way from a message's frames to its handler: the frames
checked and parsed into the service's own envelope (the dispatcher's ControlRequest, the fleet's
FleetRequest) with a kind of it (anything else, a request meant for the other service included,
dropped and counted), names a peer may send checked, a request as a handler sees it (`Asked`), the
table entry that says who may send each kind and what answers it (`Handler`), and the replies kept for
retries (`ReplyCache`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from stoker.protos import stoker_pb2 as pb
from stoker.protos.control_client import MISDIRECTED
from stoker.protos.curve import Caller
from stoker.protos.framing import MAX_HEADER_BYTES, frame_bytes

MAX_NAME = 256  # longest host or worker id accepted
REPLY_CACHE_PEERS = 4096  # peers whose last reply is kept for retries; a flood of identities cannot grow it


Q = TypeVar("Q", pb.ControlRequest, pb.FleetRequest)  # the envelope a service is asked in
A = TypeVar("A", pb.ControlReply, pb.FleetReply)  # ... and answers in


def read_request(frames: list, envelope: type[Q], drop: Callable[[str, bytes], object],
                 heard: Callable[[bytes, object], None] | None = None,
                 misdirected: Callable[[bytes, int], None] | None = None) -> tuple[bytes, Q, str] | None:
    """(peer, request, its kind) from a ROUTER's frames, the request an `envelope`; None when they are not one
    request of it (dropped by reason: bad_frames; bad_header: not the envelope, or none of its kinds;
    misdirected: a request of the other service's envelope, whose sender `misdirected(peer, request_id)`
    tells what this service is). `heard` is told of the peer and its frame before the parse."""
    peer = frame_bytes(frames[0])
    if len(frames) != 2 or len(frames[1]) > MAX_HEADER_BYTES:
        drop("bad_frames", peer)
        return None
    if heard is not None:
        heard(peer, frames[1])
    request = envelope()
    try:
        request.ParseFromString(frame_bytes(frames[1]))
    except Exception:  # protobuf DecodeError
        drop("bad_header", peer)
        return None
    kind = request.WhichOneof("kind")
    if kind is None:  # the other service's kinds are unknown fields of this envelope
        if misdirected is not None and _other_envelope_asks(envelope, frames[1]):
            drop(MISDIRECTED, peer)
            misdirected(peer, request.request_id)
        else:
            drop("bad_header", peer)
        return None
    return peer, request, kind


def _other_envelope_asks(envelope: type, frame: object) -> bool:
    """Whether the frame is a request of the other service (a fleet's at a dispatcher, or the other way)."""
    other = pb.FleetRequest() if envelope is pb.ControlRequest else pb.ControlRequest()
    try:
        other.ParseFromString(frame_bytes(frame))
    except Exception:  # protobuf DecodeError
        return False
    return other.WhichOneof("kind") is not None


@dataclass(frozen=True)
class Asked(Generic[Q]):
    """One request as a handler sees it: the message, who sent it (key and connection), and the rank its
    connection attached as (None: no consumer attached on it)."""

    request: Q
    caller: Caller
    peer: bytes
    rank: tuple[int, str] | None


S = TypeVar("S")


@dataclass(frozen=True)
class Handler(Generic[S, A]):
    """How a server (S) answers one kind of request (with an A), and who may send it: its role (WORKER: a worker
    daemon or process, CONSUMER: a rank, JOB: a job of a fleet), `needs` saying which key that takes;
    `attached`: only on a connection that attached as a consumer."""

    answer: Callable[[S, Asked], A]
    role: str
    attached: bool = False
    needs: str = ""


class ReplyCache:
    """Each asker's last reply, so that a retried request (same id) gets it again instead of a second
    answer; at most `most` askers, the longest quiet forgotten first."""

    def __init__(self, most: int = REPLY_CACHE_PEERS) -> None:
        self.most = most
        self._last: OrderedDict[bytes, tuple[int, bytes]] = OrderedDict()

    def get(self, asker: bytes, request_id: int) -> bytes | None:
        """The reply already made to `asker`'s request `request_id`, or None."""
        cached = self._last.get(asker)
        return cached[1] if cached and cached[0] == request_id else None

    def put(self, asker: bytes, request_id: int, payload: bytes) -> None:
        self._last[asker] = (request_id, payload)
        self._last.move_to_end(asker)
        if len(self._last) > self.most:
            self._last.popitem(last=False)

    def __len__(self) -> int:
        return len(self._last)


def one_line(text: str) -> str:
    """`text` on one line: a peer's free text cannot start a log line of its own."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else "?" for c in text)


def too_long(body: object) -> bool:
    """Names longer than MAX_NAME would let one peer grow the dispatcher's tables without bound, and a
    name with a newline or another control character could forge the dispatcher's log lines."""
    names = [getattr(body, f, "") for f in ("host_id", "worker_id", "consumer_id")]
    names += list(getattr(body, "worker_ids", []))
    names += [a.worker_id for a in getattr(body, "activity", [])]  # a heartbeat's processes
    reason = getattr(body, "reason", "")
    return (any(len(n) > MAX_NAME or not n.isprintable() for n in names if isinstance(n, str))
            or (isinstance(reason, str) and len(reason) > MAX_NAME))
