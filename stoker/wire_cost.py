"""What a worker pays to put a batch on the wire, for `stoker calibrate` to count.

A worker does more than make a batch: it frames it (protos.framing, with the CRC when asked) and
sends it over a CURVE-encrypted TCP connection, and the encryption and the kernel's TCP work are
CPU of the worker's process. A calibration that stops at the transform under-counts a worker by
a fifth (`stoker plan --check`, docs/ratio.md). `WireSink` is the other end: a process that takes
and drops batches, so the calibrating process can frame and send each batch as a worker does and
its CPU time holds all of it. Every wait has a deadline: a sink that stops taking batches is
reported, not waited on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import TracebackType

import numpy as np
import zmq

from stoker.protos import stoker_pb2 as pb
from stoker.protos.errors import StateError
from stoker.protos.framing import encode_tensors
from stoker.workers.sender import COPY_BELOW

START_S = 30.0  # for the sink to say its port
SEND_S = 10.0  # for one batch to leave
HWM = 4  # batches queued towards the sink, as a worker's credit window holds a few

_SINK = """
import os, sys, zmq
try:  # off the calibrated core, whose affinity it inherited (the kernel keeps the cores it may use)
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - {int(sys.argv[1])})
except OSError:
    pass  # one core only: share it
ctx = zmq.Context()
sock = ctx.socket(zmq.PULL)
sock.curve_server, sock.curve_publickey, sock.curve_secretkey = True, sys.argv[2].encode(), sys.argv[3].encode()
sock.linger = 0
port = sock.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
poller = zmq.Poller()
poller.register(sock, zmq.POLLIN)
while True:
    if poller.poll(1000):
        sock.recv_multipart(copy=False)
    elif os.getppid() == 1:  # the calibration is gone
        break
"""


def _unpin_other_threads() -> None:
    """zmq's I/O thread is born with its creator's affinity: one core, when a calibration pins itself.
    A worker's I/O thread runs on any core beside its main thread, so let this one do the same; sharing
    the calibrated core made every batch two context switches and cold caches beside busy neighbours."""
    me = threading.get_native_id()
    for name in os.listdir("/proc/self/task"):
        if int(name) != me:
            try:
                os.sched_setaffinity(int(name), range(os.cpu_count() or 1))  # the kernel keeps the allowed ones
            except OSError:
                pass  # a thread that has just ended


class SinkError(StateError):
    """The sink did not start or stopped taking batches."""


class WireSink:
    """A sink process and a CURVE client socket to it; `send(tensors)` frames and sends one batch."""

    def __init__(self, checksum: bool = False, core: int | None = None) -> None:
        self.checksum = checksum
        self.core = core if core is not None else min(os.sched_getaffinity(0))
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self.sink: subprocess.Popen | None = None

    def __enter__(self) -> WireSink:
        server_public, server_secret = zmq.curve_keypair()
        self.sink = subprocess.Popen([sys.executable, "-c", _SINK, str(self.core), server_public.decode(),
                                      server_secret.decode()], stdout=subprocess.PIPE, text=True)
        port = self._port()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        public, secret = zmq.curve_keypair()
        self.sock.curve_serverkey, self.sock.curve_publickey, self.sock.curve_secretkey = server_public, public, secret
        self.sock.sndhwm, self.sock.sndtimeo, self.sock.linger = HWM, int(SEND_S * 1000), 0
        self.sock.copy_threshold = COPY_BELOW  # as a worker's data socket
        self.sock.connect(f"tcp://127.0.0.1:{port}")
        _unpin_other_threads()
        return self

    def _port(self) -> int:
        import selectors

        assert self.sink is not None and self.sink.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.sink.stdout, selectors.EVENT_READ)
            if not sel.select(START_S):
                self.close()
                raise SinkError(f"the calibration's sink said no port within {START_S:g} s")
        line = self.sink.stdout.readline().strip()
        if not line.isdigit():
            self.close()
            raise SinkError(f"the calibration's sink did not start (it said {line!r})")
        return int(line)

    def send(self, header: pb.BatchHeader, tensors: dict[str, np.ndarray]) -> None:
        """Frame a batch as a worker does (its header's frames filled in, inside a DataMessage) and send
        it; raises SinkError past SEND_S."""
        assert self.sock is not None, "use WireSink as a context manager"
        frames = encode_tensors(header, tensors, checksum=self.checksum)
        message = pb.DataMessage(batch=header).SerializeToString()
        try:
            # numpy's stubs give ndarray its buffer protocol only from Python 3.12; it has one on 3.11
            self.sock.send_multipart([message, *frames], copy=False)  # type: ignore[list-item]
        except zmq.Again:
            raise SinkError(f"the calibration's sink took no batch for {SEND_S:g} s") from None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
        if self.ctx is not None:
            self.ctx.term()  # linger 0 on its one socket: returns at once
        if self.sink is not None:
            self.sink.kill()
            self.sink.wait(10)
        self.sock = self.ctx = self.sink = None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
