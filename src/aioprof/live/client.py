"""The client side: ``python -m aioprof snapshot PID [--format ...] [-o FILE]``.

It finds the process's socket in this user's directory (`aioprof.live.paths`, checked
as the server checks it), or its ``PID.tcp`` file (address and token) for a process
listening on TCP; ``snapshot HOST:PORT`` takes the token from AIOPROF_TOKEN instead. It
asks for one snapshot, checks that the right PID answered, and renders it here, in the client's
process, with the same renderers as the report at exit (`aioprof.report.write`), so the
profiled process only takes the snapshot and encodes it. The process goes on running;
its own report at exit is not changed by any number of snapshots.

Errors are one line on stderr: exit status 1 when there is no such process, it is not
listening, or it does not answer; 2 for a bad command line.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import stat
from typing import IO, Any, Dict, NamedTuple, NoReturn, Optional, Sequence, Tuple, Union

from aioprof.live import ENV, ListenError, listen_target, paths, protocol

__all__ = ["SnapshotError", "request", "snapshot_main"]

MAX_ANSWER = 1 << 31        # bytes of an answer line the client accepts
TOKEN_ENV = "AIOPROF_TOKEN"  # the token for `snapshot HOST:PORT`
NOT_LISTENING = (f"start it with `python -m aioprof --listen ...`, Profiler(listen=True) "
                 f"or {ENV}=1")


class SnapshotError(Exception):
    """One line for stderr; `status` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class _Endpoint(NamedTuple):
    family: int          # socket.AF_UNIX, AF_INET or AF_INET6
    address: Any         # a path, or (host, port)
    token: Optional[str]
    who: str             # "process PID" or "HOST:PORT", for messages


def _find(pid: int) -> _Endpoint:
    """Where process `pid` listens, from this user's directories (raises SnapshotError)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise SnapshotError(f"no process with PID {pid}") from None
    except PermissionError:
        raise SnapshotError(f"process {pid} belongs to another user; only its own user "
                            f"can read its figures") from None
    refused: Optional[str] = None
    for directory in paths.candidate_dirs():
        try:
            paths.check_dir(directory)
        except FileNotFoundError:
            continue
        except (ListenError, OSError) as e:   # not trusted; the socket may be in the other
            refused = refused or str(e)
            continue
        path = os.path.join(directory, paths.socket_name(pid))
        if os.path.exists(path):
            return _Endpoint(socket.AF_UNIX, path, None, f"process {pid}")
        path = os.path.join(directory, paths.token_name(pid))
        if os.path.exists(path):
            host, port, token = _read_token_file(path)
            return _Endpoint(_family(host), (host, port), token, f"process {pid}")
    if refused is not None:
        raise SnapshotError(refused)
    raise SnapshotError(f"process {pid} is not listening (no {paths.socket_name(pid)} in "
                        f"{' or '.join(paths.candidate_dirs())}); {NOT_LISTENING}")


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _read_token_file(path: str) -> Tuple[str, int, str]:
    """(host, port, token) of a PID.tcp file, which must be this user's, mode 0600."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise SnapshotError(f"refusing {path}: not a file of this user of mode 0600")
        with open(path, encoding="ascii") as f:
            info = json.loads(f.read(4096))
        host, port, token = info["host"], info["port"], info["token"]
        if not (isinstance(host, str) and isinstance(port, int) and isinstance(token, str)):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):
        raise SnapshotError(f"cannot read {path}") from None
    return host, port, token


def _endpoint(target: Union[int, str]) -> _Endpoint:
    """The endpoint of a PID, or of ``HOST:PORT`` (its token from AIOPROF_TOKEN)."""
    if isinstance(target, str) and ":" in target:
        try:
            host, port = listen_target(target, source="address")  # type: ignore[misc]
        except (ListenError, ValueError) as e:
            raise SnapshotError(str(e), 2) from None
        token = os.environ.get(TOKEN_ENV)
        if not token:
            raise SnapshotError(f"set {TOKEN_ENV} to the token the process printed when it "
                                f"started listening on {target}", 2)
        return _Endpoint(_family(host), (host, port), token, target)
    return _find(target if isinstance(target, int) else _pid(target))


def request(target: Union[int, str], op: str = "snapshot", timeout: float = 30.0) -> Dict[str, Any]:
    """Send `op` to the process `target` (a PID, or ``"HOST:PORT"`` with the token in
    AIOPROF_TOKEN) and return its answer (a dict with ``ok``); raises SnapshotError (one
    line) if it cannot be asked or does not answer by `timeout` s."""
    end = _endpoint(target)
    deadline = time.monotonic() + timeout
    sock = socket.socket(end.family, socket.SOCK_STREAM)
    req: Dict[str, Any] = {"aioprof_live": protocol.VERSION, "op": op}
    if end.token is not None:
        req["token"] = end.token
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(end.address)
        except (ConnectionRefusedError, FileNotFoundError):
            raise SnapshotError(f"{end.who} is not listening (nothing answers at "
                                f"{_shown(end)}: stale); {NOT_LISTENING}") from None
        except OSError as e:
            raise SnapshotError(f"cannot connect to {_shown(end)}: {e.strerror or e}") from None
        try:
            protocol.send_all(sock, protocol.encode(req), deadline)
            line = protocol.read_line(sock, MAX_ANSWER, deadline)
        except protocol.ProtocolError as e:
            raise SnapshotError(f"{end.who} did not answer: {e}") from None
    finally:
        sock.close()
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("aioprof_live") != protocol.VERSION:
        raise SnapshotError(f"{end.who} answered something that is not aioprof_live "
                            f"{protocol.VERSION}")
    if not answer.get("ok"):
        raise SnapshotError(f"{end.who}: {answer.get('error')}")
    if isinstance(target, int) or ":" not in target:   # a stale file, a port reused since
        if answer.get("pid") != _pid(str(target)):
            raise SnapshotError(f"{end.who}: the process answering is PID {answer.get('pid')}")
    return answer


def _shown(end: _Endpoint) -> str:
    if end.family == socket.AF_UNIX:
        return str(end.address)
    host, port = end.address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parser() -> argparse.ArgumentParser:
    from aioprof import report

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise SnapshotError(message, 2)

    p = Parser(prog="aioprof snapshot", allow_abbrev=False,
               description="Write the report of a running process started with --listen "
                           "(or Profiler(listen=True), AIOPROF_LISTEN=1), as of now, "
                           "without stopping it. See docs/live.md.")
    p.add_argument("pid", metavar="PID", help=f"the process ID (or HOST:PORT of a process listening "
                                             f"on TCP, with its token in {TOKEN_ENV})")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the report to FILE (UTF-8) instead of stdout")
    p.add_argument("--format", choices=report.FORMATS, default="text",
                   help="as the report at exit: text (default), json, collapsed or trace")
    p.add_argument("--flame", choices=report.FLAMES, default="cpu",
                   help="with --format collapsed: cpu (default), idle or wall")
    p.add_argument("--by", choices=report.VIEWS, default="coroutine",
                   help="the text report's main table (default coroutine)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="give up after S seconds (default 30)")
    return p


def _pid(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        pid = 0
    if pid <= 0:
        raise SnapshotError(f"PID must be a positive integer, not {text!r}", 2)
    return pid


def _write(doc: Dict[str, Any], opts: argparse.Namespace) -> None:
    from aioprof import report

    def render(file: IO[str]) -> None:
        report.write(doc, format=opts.format, file=file, by=opts.by, flame=opts.flame)

    try:
        report.check_options(format=opts.format, by=opts.by, flame=opts.flame)
        if opts.output is None or opts.output == "-":
            render(sys.stdout)
            sys.stdout.flush()
        else:
            from aioprof.cli import write_atomically

            write_atomically(opts.output, render)
    except (ValueError, KeyError) as e:
        raise SnapshotError(f"cannot write --format {opts.format}: {e}") from None
    except OSError as e:
        raise SnapshotError(f"cannot write the report to {opts.output!r}: {e.strerror or e}") from None


def snapshot_main(argv: Sequence[str]) -> int:
    """``aioprof snapshot`` with its arguments `argv`; returns the exit status (errors
    are said on stderr in one line)."""
    try:
        opts = _parser().parse_args(list(argv))
        if not opts.timeout > 0:
            raise SnapshotError(f"argument --timeout: must be > 0 seconds, not {opts.timeout}", 2)
        answer = request(opts.pid, "snapshot", opts.timeout)
        _write(answer["doc"], opts)
    except SnapshotError as e:
        print(f"aioprof: error: {e}", file=sys.stderr)
        return e.status
    return 0
