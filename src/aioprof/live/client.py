"""The client side: ``python -m aioprof snapshot PID [--format ...] [-o FILE]``.

It finds the process's socket in this user's directory (`aioprof.live.paths`, checked
as the server checks it), asks for one snapshot and renders it here, in the client's
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
from typing import IO, Any, Dict, NoReturn, Optional, Sequence

from aioprof.live import ENV, ListenError, paths, protocol

__all__ = ["SnapshotError", "request", "snapshot_main"]

MAX_ANSWER = 1 << 31        # bytes of an answer line the client accepts
NOT_LISTENING = (f"start it with `python -m aioprof --listen ...`, Profiler(listen=True) "
                 f"or {ENV}=1")


class SnapshotError(Exception):
    """One line for stderr; `status` is the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _find_socket(pid: int) -> str:
    """The path of `pid`'s socket in this user's directories (raises SnapshotError)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise SnapshotError(f"no process with PID {pid}") from None
    except PermissionError:
        raise SnapshotError(f"process {pid} belongs to another user; only its own user "
                            f"can read its figures") from None
    refused: Optional[str] = None
    for directory in paths.candidate_dirs():
        path = os.path.join(directory, paths.socket_name(pid))
        try:
            paths.check_dir(directory)
        except FileNotFoundError:
            continue
        except (ListenError, OSError) as e:   # not trusted; the socket may be in the other
            refused = refused or str(e)
            continue
        if os.path.exists(path):
            return path
    if refused is not None:
        raise SnapshotError(refused)
    raise SnapshotError(f"process {pid} is not listening (no {paths.socket_name(pid)} in "
                        f"{' or '.join(paths.candidate_dirs())}); {NOT_LISTENING}")


def request(pid: int, op: str = "snapshot", timeout: float = 30.0) -> Dict[str, Any]:
    """Send `op` to process `pid` and return its answer (a dict with ``ok``); raises
    SnapshotError (one line) if it cannot be asked or does not answer by `timeout` s."""
    path = _find_socket(pid)
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            raise SnapshotError(f"process {pid} is not listening (its socket {path} is "
                                f"stale); {NOT_LISTENING}") from None
        except OSError as e:
            raise SnapshotError(f"cannot connect to {path}: {e.strerror or e}") from None
        try:
            protocol.send_all(sock, protocol.encode({"aioprof_live": protocol.VERSION, "op": op}), deadline)
            line = protocol.read_line(sock, MAX_ANSWER, deadline)
        except protocol.ProtocolError as e:
            raise SnapshotError(f"process {pid} did not answer: {e}") from None
    finally:
        sock.close()
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("aioprof_live") != protocol.VERSION:
        raise SnapshotError(f"process {pid} answered something that is not aioprof_live "
                            f"{protocol.VERSION}")
    if not answer.get("ok"):
        raise SnapshotError(f"process {pid}: {answer.get('error')}")
    return answer


def _parser() -> argparse.ArgumentParser:
    from aioprof import report

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise SnapshotError(message, 2)

    p = Parser(prog="aioprof snapshot", allow_abbrev=False,
               description="Write the report of a running process started with --listen "
                           "(or Profiler(listen=True), AIOPROF_LISTEN=1), as of now, "
                           "without stopping it. See docs/live.md.")
    p.add_argument("pid", help="the process ID")
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
        answer = request(_pid(opts.pid), "snapshot", opts.timeout)
        _write(answer["doc"], opts)
    except SnapshotError as e:
        print(f"aioprof: error: {e}", file=sys.stderr)
        return e.status
    return 0
