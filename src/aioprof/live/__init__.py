"""Live use: a profiled process serves its figures while it runs (docs/live.md).

`aioprof.live.server.Server` is the listening side: a daemon thread of the profiled
process that answers on a Unix socket ``DIR/PID.sock`` (`paths.socket_dir`, a directory
only the process's user can enter), or on a loopback TCP port with a token
(``--listen 127.0.0.1:PORT``). `aioprof.live.client` is the other side:
``python -m aioprof snapshot PID`` connects, asks for the report document and renders
it in the client's own process. `protocol` is the wire format both speak.

Nothing here is imported unless listening is asked for (``--listen``,
``Profiler(listen=True)``, ``AIOPROF_LISTEN=1``) or a client runs.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Tuple, Union

__all__ = ["ENV", "ListenError", "Target", "listen_target"]

ENV = "AIOPROF_LISTEN"
"""The environment variable that makes a Profiler listen when its `listen` is None."""


class ListenError(Exception):
    """Listening cannot start (one line: a refused directory, an address that is not
    loopback, ...)."""


Target = Union[str, Tuple[str, int]]
"""What to listen on: "unix" (the Unix socket) or (host, port), a loopback TCP address."""


def listen_target(listen: Any, environ: Optional[dict] = None, source: str = "listen") -> Optional[Target]:
    """What a Profiler's `listen` argument asks for: None (do not listen), "unix", or
    (host, port) for TCP on a loopback address.

    `listen` None defers to ``AIOPROF_LISTEN`` in `environ` (default os.environ): unset,
    "" or "0" is off, "1" is the Unix socket, anything else is read as an address.
    True or "unix" is the Unix socket; False is off; a string ``HOST:PORT`` is TCP, where
    HOST must be a loopback address (127.0.0.1, another 127.x.y.z, ::1 as ``[::1]``, or
    localhost) and PORT 0-65535 (0: any free port). A bad address raises ListenError,
    any other value ValueError; both name `source` (the option or argument).
    """
    if listen is None:
        value = (os.environ if environ is None else environ).get(ENV, "")
        if value in ("", "0"):
            return None
        listen, source = ("unix" if value == "1" else value), ENV
    if listen is False:
        return None
    if listen is True or listen == "unix":
        return "unix"
    if isinstance(listen, str) and ":" in listen:
        return _address(listen, source)
    raise ValueError(f"{source} must be True, False, None, 'unix' or 'HOST:PORT', not {listen!r}")


def _address(text: str, source: str) -> Tuple[str, int]:
    import ipaddress

    host, _, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError
    except ValueError:
        raise ListenError(f"{source}={text}: the port must be an integer from 0 to 65535") from None
    if host == "localhost":
        host = "127.0.0.1"
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ListenError(f"{source}={text}: only a loopback address (127.0.0.1, [::1]) can be "
                          f"listened on: the figures and the token would cross the network in "
                          f"clear text")
    return host, port
