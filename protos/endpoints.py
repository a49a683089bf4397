"""Binding ZeroMQ sockets with errors a person can act on."""

from __future__ import annotations

import zmq


class PortInUseError(OSError):
    pass


def bind(socket: zmq.Socket, endpoint: str, what: str) -> str:
    """Bind `endpoint` (port 0 picks a free one); returns the endpoint actually bound."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        endpoint = endpoint[:-2] + ":*"
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EADDRINUSE:
            raise PortInUseError(f"{what} endpoint {endpoint} is already in use: stop the other "
                                 f"process or choose another port") from exc
        raise OSError(f"cannot bind {what} endpoint {endpoint}: {exc}") from exc
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)


def advertised(bound: str, host: str | None) -> str:
    """The endpoint peers should connect to: `bound`, with a wildcard host replaced."""
    scheme, rest = bound.split("://", 1)
    address, port = rest.rsplit(":", 1)
    if host:
        address = host
    elif address in ("0.0.0.0", "*"):
        address = "127.0.0.1"
    return f"{scheme}://{address}:{port}"
