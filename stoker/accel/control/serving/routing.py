"""What the control sockets (the dispatcher's, accel.control.serving.server, and the fleet's,
accel.fleet.service) share on the way from a message's frames to its handler: the frames
checked and parsed (anything else dropped and counted), names a peer may send checked, a request as
a handler sees it (`Asked`), the table entry that says who may send each kind and what answers it
(`Handler`), and the replies kept for retries (`ReplyCache`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from stoker.protos import stoker_pb2 as pb
from stoker.protos.curve import Caller
from stoker.protos.framing import MAX_HEADER_BYTES, frame_bytes

MAX_NAME = 256  # longest host or worker id accepted
REPLY_CACHE_PEERS = 4096  # peers whose last reply is kept for retries; a flood of identities cannot grow it


def read_request(frames: list, drop: Callable[[str, bytes], object],
                 heard: Callable[[bytes, object], None] | None = None) -> tuple[bytes, pb.ControlRequest] | None:
    """(peer, request) from a ROUTER's frames; None when they are not one request (dropped by reason:
    bad_frames, bad_header). `heard` is told of the peer and its frame before the parse."""
    peer = frame_bytes(frames[0])
    if len(frames) != 2 or len(frames[1]) > MAX_HEADER_BYTES:
        drop("bad_frames", peer)
        return None
    if heard is not None:
        heard(peer, frames[1])
    request = pb.ControlRequest()
    try:
        request.ParseFromString(frame_bytes(frames[1]))
    except Exception:  # protobuf DecodeError
        drop("bad_header", peer)
        return None
    return peer, request


@dataclass(frozen=True)
class Asked:
    """One request as a handler sees it: the message, who sent it (key and connection), and the rank its
    connection attached as (None: no consumer attached on it)."""

    request: pb.ControlRequest
    caller: Caller
    peer: bytes
    rank: tuple[int, str] | None


S = TypeVar("S")


@dataclass(frozen=True)
class Handler(Generic[S]):
    """How a server (S) answers one kind of request, and who may send it: its role (WORKER: a worker daemon or
    process, CONSUMER: a rank, JOB: a job of a fleet), `needs` saying which key that takes; `attached`: only on
    a connection that attached as a consumer."""

    answer: Callable[[S, Asked], pb.ControlReply]
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
    reason = getattr(body, "reason", "")
    return (any(len(n) > MAX_NAME or not n.isprintable() for n in names if isinstance(n, str))
            or (isinstance(reason, str) and len(reason) > MAX_NAME))
