"""ggml's RPC backend: devices on other hosts (``rpc-server`` on each), as llama.cpp's ``--rpc host:port,...``.

ggml ends the process when it cannot reach a server it is given, so each server is first greeted here, with a
bounded wait, and a server that does not answer, or answers another protocol, is a clear error instead."""
from __future__ import annotations

import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any

from ._native.ffi import ffi
from .errors import ParameterError, RpcServerError

log = logging.getLogger(__name__)

# ggml-rpc.h and ggml-rpc/transport.h of the pinned base: the greeting every connection starts with
RPC_PROTO_MAJOR_VERSION = 7
_RPC_CMD_HELLO = 14
_RPC_CONN_CAPS_SIZE = 24
_HELLO_RSP_SIZE = 4 + _RPC_CONN_CAPS_SIZE

GREETING_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoint(text: Any) -> Endpoint:
    """``host:port``, as ``rpc-server -H HOST -p PORT`` listens; ParameterError otherwise. ggml splits at the first
    colon, so an IPv6 address is written as a host name that resolves to it."""
    if not isinstance(text, str) or not text or "\0" in text or "," in text or text != text.strip():
        raise ParameterError(f"rpc: each server is one 'host:port' string, got {text!r}")
    host, _, port = text.partition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ParameterError(f"rpc: {text!r} is not 'host:port' with a port of 1-65535 (an IPv6 address needs a "
                             f"host name: ggml splits at the first colon)")
    return Endpoint(host, int(port))


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            break
        data += part
    return data


def greet(endpoint: Endpoint, timeout_s: float = GREETING_TIMEOUT_S) -> tuple[int, int, int]:
    """The server's protocol version (major, minor, patch); RpcServerError when it does not answer within
    timeout_s, closes the connection, or speaks another protocol. The connection is closed again: ggml opens its own."""
    where = str(endpoint)
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack("<BQ", _RPC_CMD_HELLO, _RPC_CONN_CAPS_SIZE) + bytes(_RPC_CONN_CAPS_SIZE))
            head = _recv_exactly(sock, 8)
            if len(head) < 8 or struct.unpack("<Q", head)[0] != _HELLO_RSP_SIZE:
                raise RpcServerError(f"rpc: {where} answered, but not as a ggml rpc-server of protocol "
                                     f"{RPC_PROTO_MAJOR_VERSION}.x (its greeting was {head!r})")
            body = _recv_exactly(sock, _HELLO_RSP_SIZE)
    except RpcServerError:
        raise
    except socket.timeout:
        raise RpcServerError(f"rpc: {where} did not answer within {timeout_s:g} s (an rpc-server serves one client at "
                             f"a time: is another one using it?)") from None
    except OSError as exc:
        raise RpcServerError(f"rpc: no rpc-server answers at {where}: {exc.strerror or exc}") from None
    if len(body) < 3:
        raise RpcServerError(f"rpc: {where} closed the connection during the greeting")
    version = (body[0], body[1], body[2])
    if version[0] != RPC_PROTO_MAJOR_VERSION:
        raise RpcServerError(f"rpc: {where} speaks RPC protocol {'.'.join(map(str, version))}; this build speaks "
                             f"{RPC_PROTO_MAJOR_VERSION}.x (run an rpc-server of the same llama.cpp build)")
    return version


# the servers this process has added: ggml keeps one connection to each while anything of it is loaded, and a
# server serves one client at a time, so a greeting of ours would wait behind our own connection
_added: set[Endpoint] = set()


def _reachable(endpoint: Endpoint, timeout_s: float = GREETING_TIMEOUT_S) -> None:
    """A server added before: its port still takes connections (RpcServerError if not); nothing is sent."""
    try:
        socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s).close()
    except OSError as exc:
        raise RpcServerError(f"rpc: no rpc-server answers at {endpoint}: {exc.strerror or exc}") from None


def rpc_devices(lib: Any, endpoints: tuple[str, ...]) -> list[Any]:
    """Each server's devices (ggml_backend_dev_t), in the order given; every server is greeted first (one added
    before is only checked to take connections)."""
    parsed = [parse_endpoint(e) for e in endpoints]
    for ep in parsed:
        _reachable(ep) if ep in _added else greet(ep)
    out: list[Any] = []
    for ep in parsed:
        reg = lib.ggml_backend_rpc_add_server(str(ep).encode())
        _added.add(ep)
        if reg == ffi.NULL:
            raise RpcServerError(f"rpc: {ep} offers no device")
        out += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg))]
        log.info("rpc: %s: %d device(s)", ep, lib.ggml_backend_reg_dev_count(reg))
    return out
