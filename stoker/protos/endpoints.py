"""Binding ZeroMQ sockets, and reaching them, with errors a person can act on."""

from __future__ import annotations

import socket
from typing import TypeGuard

import zmq

from stoker.protos.errors import ResourceError


class PortInUseError(ResourceError):
    pass


NO_PORT = -1  # a metrics port of -1 (or None) serves no HTTP endpoint, as the --metrics-port flags document
MAX_PORT = 65535


def endpoint_problem(text: object) -> str | None:
    """Why `text` is not a ZeroMQ endpoint Stoker binds or connects (None: it is): tcp://HOST:PORT
    (PORT 0-65535; 0 or * on a bind: any free one), ipc://PATH or inproc://NAME. The flags and the
    configs check with this one rule, so a typo is one line where it is made, not a socket error."""
    if not isinstance(text, str):
        return f"must be an endpoint tcp://HOST:PORT (or ipc://PATH), not {text!r}"
    scheme, sep, rest = text.partition("://")
    host, colon, port_text = rest.rpartition(":")
    tcp_ok = scheme == "tcp" and bool(colon) and bool(host) and (
        port_text == "*" or (port_text.isascii() and port_text.isdigit() and int(port_text) <= MAX_PORT))
    if not sep or not (tcp_ok or (scheme in ("ipc", "inproc") and rest)):
        return f"must be an endpoint tcp://HOST:PORT (or ipc://PATH), not {text!r}"
    return None


def peer_endpoint_problem(text: object) -> str | None:
    """Why `text` is not an endpoint a peer listens at (None: it is): an endpoint_problem, or a wildcard host
    or port (`*`, port 0), which pick an address on a bind and name none to connect to."""
    why = endpoint_problem(text)
    if why or not isinstance(text, str) or not text.startswith("tcp://"):
        return why
    host, _, port = text.removeprefix("tcp://").rpartition(":")
    if host == "*" or port == "*" or int(port) == 0:
        return (f"must be where a peer listens, tcp://HOST:PORT with its own host and port (* and 0 only bind), "
                f"not {text!r}")
    return None


def serves(port: int | None) -> TypeGuard[int]:
    """Whether a configured metrics port asks for an endpoint (0: a free one; -1 or None: none)."""
    return port is not None and port != NO_PORT


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
        raise ResourceError(f"cannot bind {what} endpoint {endpoint}: {exc}") from exc
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


def why_unreachable(endpoint: str, timeout_s: float = 2.0, fleet: bool = False) -> str:
    """What a plain TCP connection to `endpoint` meets, in words: ZeroMQ retries silently, so a peer
    that gets no answer asks here whether anything listens there at all. `fleet`: the peer is a
    `stoker fleet`, not a job's dispatcher."""
    if not endpoint.startswith("tcp://"):
        return "not a TCP endpoint"
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            if fleet:
                return ("something listens there but does not answer: a fleet that wants CURVE keys and does not "
                        "admit this one (a host's is a worker key, a job's a job key: stoker keys add DIR NAME --role "
                        "job), a busy one, or another service")
            return ("something listens there but does not answer: a dispatcher that wants CURVE keys (give this "
                    "host --keys DIR --key-name NAME), a busy one, or another service")
    except socket.gaierror as exc:
        return f"the name {host!r} does not resolve ({exc.strerror})"
    except ConnectionRefusedError:
        if fleet:
            return "nothing listens there: is `stoker fleet` up there, and does it bind an address this host reaches?"
        return ("nothing listens there yet: is the job's rank 0 (or stoker dispatch) up, and does it bind an address "
                "this host reaches ($STOKER_HOST, --control-bind)?")
    except TimeoutError:
        return "no answer to a TCP connection in time: no route there, or a firewall drops it"
    except OSError as exc:
        return exc.strerror or str(exc)
