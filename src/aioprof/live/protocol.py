"""The wire format of the live socket: one JSON line each way, one request per connection.

A client connects and sends one line (UTF-8 JSON object, at most `MAX_REQUEST` bytes with
its newline)::

    {"aioprof_live": 1, "op": "snapshot"}

(with ``"token": "..."`` when the process listens on TCP), and the server answers one
line and closes the connection::

    {"aioprof_live": 1, "ok": true, "pid": 123, "doc": {...the report document...}}
    {"aioprof_live": 1, "ok": false, "error": "one line"}

``aioprof_live`` is the protocol version (`VERSION`); a request of another version, an
unknown op, a line that is not a JSON object, or one longer than `MAX_REQUEST` gets an
error answer. Ops: ``snapshot`` (the report document of docs/json.md, as of now) and
``hello`` (pid, aioprof and Python versions, no figures). JSON keeps newlines out of the
line: strings escape them.
"""
from __future__ import annotations

import json
import socket
import time
from typing import Any, Dict, Iterator

__all__ = ["MAX_REQUEST", "OPS", "VERSION", "ProtocolError", "decode_request", "encode",
           "encode_in_pieces", "read_line", "send_all"]

VERSION = 1
MAX_REQUEST = 4096
OPS = ("snapshot", "hello")


class ProtocolError(Exception):
    """A message that breaks the protocol, or a peer that timed out or went away."""


def encode(obj: Dict[str, Any]) -> bytes:
    return _dumps(obj).encode("ascii") + b"\n"


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True)


def _pieces(obj: Any, depth: int) -> Iterator[str]:
    if depth > 0 and isinstance(obj, list):
        yield "["
        for i, item in enumerate(obj):
            if i:
                yield ","
            yield from _pieces(item, depth - 1)
        yield "]"
    elif depth > 0 and isinstance(obj, dict) and all(isinstance(k, str) for k in obj):
        yield "{"
        for i, (key, value) in enumerate(obj.items()):
            yield ("," if i else "") + _dumps(key) + ":"
            yield from _pieces(value, depth - 1)
        yield "}"
    else:
        yield _dumps(obj)


def encode_in_pieces(obj: Dict[str, Any], depth: int = 3) -> bytes:
    """`encode(obj)`, byte for byte, made a piece at a time: the dicts and lists of the
    top `depth` levels are encoded item by item, so that no single call into the JSON
    encoder (which holds the GIL throughout) encodes the whole document; the program's
    threads get the GIL between pieces."""
    return "".join(_pieces(obj, depth)).encode("ascii") + b"\n"


def decode_request(line: bytes) -> Dict[str, Any]:
    """The request of a line (a dict with a known "op"); raises ProtocolError saying what
    is wrong with it."""
    try:
        req = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("the request is not a line of JSON") from None
    if not isinstance(req, dict):
        raise ProtocolError("the request is not a JSON object")
    version = req.get("aioprof_live")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported (this process "
                            f"speaks aioprof_live {VERSION})")
    op = req.get("op")
    if op not in OPS:
        raise ProtocolError(f"unknown op {op!r} (ops: {', '.join(OPS)})")
    return req


def read_line(sock: socket.socket, limit: int, deadline: float) -> bytes:
    """Read up to and including the first newline, by `deadline` (time.monotonic()),
    at most `limit` bytes. Raises ProtocolError on a timeout, an end of stream before
    the newline, or a longer line."""
    buf = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProtocolError("timed out")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(65536, limit + 1 - len(buf)))
        except socket.timeout:
            raise ProtocolError("timed out") from None
        except OSError as e:
            raise ProtocolError(f"connection lost: {e.strerror or e}") from None
        if not chunk:
            raise ProtocolError("connection closed before the end of the message")
        end = chunk.find(b"\n")
        if end >= 0:
            buf += chunk[:end + 1]
            if len(buf) > limit:
                raise ProtocolError(f"message longer than {limit} bytes")
            return bytes(buf)
        buf += chunk
        if len(buf) >= limit:
            raise ProtocolError(f"message longer than {limit} bytes")


def send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    """Send `data` by `deadline`; never raises SIGPIPE (MSG_NOSIGNAL), whatever the
    process's SIGPIPE disposition. Raises ProtocolError on a timeout or a closed peer."""
    view = memoryview(data)
    flags = getattr(socket, "MSG_NOSIGNAL", 0)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProtocolError("timed out")
        sock.settimeout(left)
        try:
            sent = sock.send(view[:1 << 20], flags)
        except socket.timeout:
            raise ProtocolError("timed out") from None
        except OSError as e:
            raise ProtocolError(f"connection lost: {e.strerror or e}") from None
        view = view[sent:]
