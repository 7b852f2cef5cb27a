"""Live use: a profiled process serves its figures while it runs (docs/live.md).

`aioprof.live.server.Server` is the listening side: a daemon thread of the profiled
process that answers on a Unix socket ``DIR/PID.sock`` (`paths.socket_dir`, a directory
only the process's user can enter). `aioprof.live.client` is the other side:
``python -m aioprof snapshot PID`` connects, asks for the report document and renders
it in the client's own process. `protocol` is the wire format both speak.

Nothing here is imported unless listening is asked for (``--listen``,
``Profiler(listen=True)``, ``AIOPROF_LISTEN=1``) or a client runs.
"""
from __future__ import annotations

import os
from typing import Any, Optional

__all__ = ["ENV", "ListenError", "listen_target"]

ENV = "AIOPROF_LISTEN"
"""The environment variable that makes a Profiler listen when its `listen` is None."""


class ListenError(Exception):
    """Listening cannot start (one line: a refused directory, TCP not supported, ...)."""


def listen_target(listen: Any, environ: Optional[dict] = None) -> Optional[str]:
    """What a Profiler's `listen` argument asks for: None (do not listen) or "unix".

    `listen` None defers to ``AIOPROF_LISTEN`` in `environ` (default os.environ): unset,
    "" or "0" is off, "1" is the Unix socket, anything else is read as an address.
    True or "unix" is the Unix socket; False is off. An address ``HOST:PORT`` raises
    ListenError (TCP is not supported yet); any other value raises ValueError.
    """
    source = "listen"
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
        raise ListenError(f"{source}={listen!r}: listening on TCP (HOST:PORT) is not supported "
                          f"yet; listen on the Unix socket instead (--listen, listen=True, "
                          f"{ENV}=1)")
    raise ValueError(f"{source} must be True, False, None or 'unix', not {listen!r}")
