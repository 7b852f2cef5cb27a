"""The listening side: a profiled process answers on its Unix socket while it runs.

`Server` binds ``DIR/PID.sock`` (`aioprof.live.paths`; directory 0700, socket 0600) and
serves it from threads of its own, started with ``_thread`` rather than ``threading``:
they never run a trace or profile function the program set with ``threading.settrace``
/ ``setprofile``, they are not in ``threading.enumerate()``, and they block the
asynchronous signals (a signal sent to the process is never delivered to them). One thread accepts;
each connection gets a thread that reads one request line by a deadline, answers it and
closes (`aioprof.live.protocol`), at most `MAX_CLIENTS` at a time. The only work done
for a request is the snapshot function it is given (the C core's snapshot, under the
GIL, then the conversion to the report document) and the JSON encoding of the answer,
both in the connection's thread; the program's loop threads are never asked to do
anything. A client that stalls, goes away mid-message, sends garbage or too much is
answered with an error or dropped; a client of another user is refused (SO_PEERCRED)
even if it got past the directory's permissions. Answers are sent with MSG_NOSIGNAL, so
a client that goes away cannot raise SIGPIPE in a program that set it to its default.

With a TCP target (``--listen 127.0.0.1:PORT``; loopback addresses only), the socket
is a TCP port, and every request must carry a random 256-bit token (compared in
constant time); the token is in ``DIR/PID.tcp`` (mode 0600, with the address) and in the
line `announcement()` gives the owner. The directory rules are the same.

`stop()` closes the socket and removes the file (only in the process that made it: a
forked child closes its copies of the descriptors and leaves the file alone).
"""
from __future__ import annotations

import _thread
import contextlib
import errno
import hmac
import os
import platform
import secrets
import select
import signal
import socket
import struct
import time
import weakref
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from aioprof.live import ListenError, Target, paths, protocol

__all__ = ["MAX_CLIENTS", "REQUEST_TIMEOUT_S", "SEND_TIMEOUT_S", "Server"]

MAX_CLIENTS = 8            # connections served at once; more are told to retry
REQUEST_TIMEOUT_S = 10.0   # to receive the request line after connecting
SEND_TIMEOUT_S = 60.0      # to send the answer (a large document to a slow reader)

_servers: "weakref.WeakSet[Server]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for server in list(_servers):
        server._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Block the asynchronous signals in this thread for the block's duration, so that a
    thread started inside inherits them blocked: a signal sent to the process (SIGTERM,
    SIGINT, SIGCHLD...) never lands in aioprof's threads, whose blocking calls it would
    interrupt instead of the program's. The faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
    SIGABRT) stay deliverable: they are the thread's own, and faulthandler reports them."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    faults = {getattr(signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
              if hasattr(signal, name)}
    old = mask(signal.SIG_BLOCK, set(signal.valid_signals()) - faults)
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


def _file_id(fd: int) -> Optional[Tuple[int, int]]:
    """(st_dev, st_ino) of the file a descriptor names, None if it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _write_private(path: str, data: bytes) -> None:
    """Write a new file of mode 0600 (refusing to follow a symlink or reuse a file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def _peer_uid(conn: socket.socket) -> Optional[int]:
    """The connecting process's uid (Linux SO_PEERCRED), None where it cannot be read."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    except OSError:
        return None


class Server:
    """Serve `snapshot()` (a callable returning the report document) on this process's
    socket. The constructor binds the socket (raises ListenError, one line, if the
    directory is refused or the socket cannot be made); `start()` starts serving."""

    def __init__(self, snapshot: Callable[[], Dict[str, Any]], version: str,
                 target: Target = "unix") -> None:
        self.snapshot = snapshot
        self.version = version
        self.pid = os.getpid()
        self.dir = paths.socket_dir(create=True)
        self.address: Optional[Tuple[str, int]] = None   # TCP: (host, port) bound
        self.token: Optional[str] = None                 # TCP: what every request carries
        self._lock = _thread.allocate_lock()      # guards _clients and _stopping
        self._clients = 0
        self._stopping = False
        self._done = _thread.allocate_lock()      # held while the accept thread runs
        self._closed = False
        self._wake_r = self._wake_w = -1
        self._ids: Dict[int, Optional[Tuple[int, int]]] = {}   # descriptor -> its file's id
        try:
            self._wake_r, self._wake_w = os.pipe()
        except OSError as e:
            raise ListenError(f"cannot listen: {e.strerror or e}") from None
        # The file is made under a temporary name, with its final permissions, then
        # renamed into place: it never appears under its name with other permissions, and
        # a stale file of a dead process with the same PID is replaced.
        tmp = os.path.join(self.dir, f".{self.pid}.{os.urandom(4).hex()}.tmp")
        try:
            if target == "unix":
                self.path = os.path.join(self.dir, paths.socket_name(self.pid))
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.bind(tmp)
                os.chmod(tmp, 0o600)
                self.sock.listen(16)
            else:
                self.path = os.path.join(self.dir, paths.token_name(self.pid))
                host, port = target
                self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                                          socket.SOCK_STREAM)
                self.sock.bind((host, port))
                self.sock.listen(16)
                self.address = (host, self.sock.getsockname()[1])
                self.token = secrets.token_hex(32)
                _write_private(tmp, protocol.encode({"pid": self.pid, "host": host,
                                                     "port": self.address[1], "token": self.token}))
            os.replace(tmp, self.path)
            self.ino = os.stat(self.path).st_ino
            self._remember_fds()
        except OSError as e:
            self._remember_fds()   # all still ours
            self._close_fds()
            try:
                os.unlink(tmp)
            except OSError:
                pass
            where = self.path if target == "unix" else "%s:%s" % target
            raise ListenError(f"cannot listen on {where}: {e.strerror or e}") from None
        _servers.add(self)

    def announcement(self) -> Optional[str]:
        """TCP: the line to tell the owner (address, token, token file); None for Unix."""
        if self.address is None:
            return None
        host, port = self.address
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return (f"listening on {shown} (pid {self.pid}); every request must carry the token "
                f"{self.token} (also in {self.path}, mode 0600)")

    def start(self) -> "Server":
        self._done.acquire()
        try:
            with _signals_blocked():   # inherited by the thread, and by the ones it starts
                _thread.start_new_thread(self._accept_loop, ())
        except RuntimeError as e:
            self._done.release()
            self.stop()
            raise ListenError(f"cannot start the listening thread: {e}") from None
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop accepting, wait up to `timeout` s for the accept thread, close the socket
        and remove its file. Idempotent. Connections being answered finish by their own
        deadlines (their snapshots then say the profiler has stopped)."""
        _servers.discard(self)
        if os.getpid() != self.pid:
            self._forget()
            return
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._done.acquire(timeout=timeout):
            self._done.release()
        try:
            if os.stat(self.path).st_ino == self.ino:
                os.unlink(self.path)
        except OSError:
            pass
        self._close_fds()

    def _forget(self) -> None:
        """In a forked child: close this process's copies, leave the parent's file (the
        threads were not forked; their locks may have been held at the fork)."""
        self._stopping = True
        self._lock = _thread.allocate_lock()
        self._close_fds()

    def _remember_fds(self) -> None:
        """Note which files our descriptors name, to close only those (`_close_fds`)."""
        fds = [self._wake_r, self._wake_w]
        sock = getattr(self, "sock", None)
        if sock is not None:
            fds.append(sock.fileno())
        self._ids = {fd: _file_id(fd) for fd in fds if fd >= 0}

    def _close_fds(self) -> None:
        """Close the socket and the wake pipe, once, and only the descriptors that still
        name our files: a number closed twice, or closed by the program and reused, is a
        file of the program's."""
        if self._closed:
            return
        self._closed = True
        fds = [fd for fd in (self._wake_r, self._wake_w) if fd >= 0]
        try:
            fds.append(self.sock.detach())
        except (AttributeError, OSError):   # no socket made
            pass
        for fd in fds:
            if self._ids.get(fd) == _file_id(fd):   # else the program's file now: leave it
                try:
                    os.close(fd)
                except OSError:
                    pass

    # -- threads ------------------------------------------------------------------
    def _accept_loop(self) -> None:
        try:
            poller = select.poll()
            poller.register(self.sock.fileno(), select.POLLIN)
            poller.register(self._wake_r, select.POLLIN)
            while not self._stopping:
                events = dict(poller.poll())
                if self._wake_r in events or self._stopping:
                    break
                try:
                    conn, _ = self.sock.accept()
                except OSError as e:
                    if e.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                        break          # the program closed our descriptor: stop serving
                    time.sleep(0.05)   # out of descriptors or memory: no busy loop
                    continue
                self._dispatch(conn)
        except BaseException:   # never let an exception out of an aioprof thread
            pass
        finally:
            self._done.release()

    def _dispatch(self, conn: socket.socket) -> None:
        uid = _peer_uid(conn) if self.address is None else None
        if uid is not None and uid not in (os.geteuid(), 0):
            conn.close()
            return
        with self._lock:
            busy = self._clients >= MAX_CLIENTS
            if not busy:
                self._clients += 1
        if busy:
            self._reply(conn, self._error(f"{MAX_CLIENTS} clients are being served; try again"),
                        time.monotonic() + 1.0)
            return
        try:
            _thread.start_new_thread(self._serve, (conn,))
        except RuntimeError:
            with self._lock:
                self._clients -= 1
            conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            try:
                line = protocol.read_line(conn, protocol.MAX_REQUEST, time.monotonic() + REQUEST_TIMEOUT_S)
                request = protocol.decode_request(line)
                answer = self._answer(request["op"]) if self._authorized(request) else \
                    self._error("this process listens on TCP: every request must carry its token "
                                "(missing or wrong)")
            except protocol.ProtocolError as e:
                answer = self._error(str(e))
            self._reply(conn, answer, time.monotonic() + SEND_TIMEOUT_S)
        except BaseException:
            pass
        finally:
            with self._lock:
                self._clients -= 1

    def _authorized(self, request: Dict[str, Any]) -> bool:
        if self.token is None:
            return True   # the Unix socket: its directory and mode are the lock
        given = request.get("token")
        return isinstance(given, str) and hmac.compare_digest(
            given.encode("utf-8", "replace"), self.token.encode("ascii"))

    def _answer(self, op: str) -> Dict[str, Any]:
        base = {"aioprof_live": protocol.VERSION, "ok": True, "pid": self.pid}
        if op == "hello":
            base.update(aioprof=self.version, python=platform.python_version())
            return base
        try:
            base["doc"] = self.snapshot()
        except Exception as e:
            return self._error(f"no snapshot: {e}")
        return base

    @staticmethod
    def _error(message: str) -> Dict[str, Any]:
        return {"aioprof_live": protocol.VERSION, "ok": False, "error": message}

    @staticmethod
    def _reply(conn: socket.socket, answer: Dict[str, Any], deadline: float) -> None:
        try:
            try:
                data = protocol.encode_in_pieces(answer)
            except (TypeError, ValueError) as e:
                data = protocol.encode(Server._error(f"cannot encode the answer: {e}"))
            protocol.send_all(conn, data, deadline)
            conn.shutdown(socket.SHUT_WR)
        except (protocol.ProtocolError, OSError):
            pass
        finally:
            conn.close()
