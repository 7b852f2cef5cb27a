"""``python -m aioprof --subprocesses``: profile the program's child processes too.

How each kind of child is followed (docs/cli.md, "Worker processes"):

- ``os.fork()`` (and multiprocessing's fork, and the workers a forkserver forks): an
  ``os.register_at_fork(after_in_child=...)`` hook drops the session copied from the
  parent (its figures are the parent's) and starts a new one in the child;
- a new interpreter (``subprocess`` running Python, multiprocessing's spawn and its
  forkserver process): the parent sets two variables in the process environment (not in
  ``os.environ``, which the program sees unchanged): ``AIOPROF_SUBPROCESSES`` (JSON: the
  parts directory and the profiler's options) and ``PYTHONPATH`` with the directory of
  aioprof's ``_boot/sitecustomize.py`` first. That module puts the child's view back
  (sys.path, ``os.environ``), imports the program's own sitecustomize, and calls
  `start_child`.

Each child writes its report document (docs/json.md, with a ``process`` member) as
``<pid>.json`` into a private directory (mode 0700) that the parent made: every
`PERIOD_S` seconds (or 20 times as long as a write took, if longer) from a thread of its
own, at SIGTERM left at its default, and at exit
(atexit, or multiprocessing's exit for its fork and forkserver children), each time
written beside it and renamed, so a child that is killed loses only what it did since
its last write. The parent never waits for a child: at its end it merges its own
document with the parts found (`Parent.merged`), says which children had not written
their final part (still running, or killed), and removes the directory.
"""
from __future__ import annotations

import _thread
import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["ENV", "PERIOD_S", "Parent", "start_child"]

ENV = "AIOPROF_SUBPROCESSES"
PERIOD_S = 1.0     # seconds between a child's writes of its part
_BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")
_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # where aioprof imports from

# The session of this process (the parent's, or a child's) that a fork replaces.
_current: Any = None
_conf: Optional[Dict[str, Any]] = None
_hooked = False


def _process_info(final: bool) -> Dict[str, Any]:
    return {"argv": list(sys.argv), "ppid": os.getppid(), "final": final,
            "written_unix_s": time.time()}


def _write_json(path: str, doc: Dict[str, Any]) -> None:
    """Write `doc` to `path` atomically (a private file beside it, then renamed)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with open(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Parent:
    """The parts directory and the environment that make children follow; one per run
    of ``python -m aioprof --subprocesses``."""

    def __init__(self, profiler_kwargs: Dict[str, Any], period_s: float = PERIOD_S) -> None:
        self.dir = tempfile.mkdtemp(prefix="aioprof-parts-")     # mode 0700
        self.pid = os.getpid()
        pythonpath = os.environ.get("PYTHONPATH")
        # (--listen serves the parent only: a child does not listen.)
        kwargs = dict(profiler_kwargs, listen=False) if "listen" in profiler_kwargs else profiler_kwargs
        self.conf = {"dir": self.dir, "kwargs": kwargs, "pythonpath": pythonpath,
                     "period_s": period_s, "home": _HOME}
        # The process environment only: os.environ (the program's view) stays as it is.
        os.putenv(ENV, json.dumps(self.conf))
        os.putenv("PYTHONPATH", _BOOT + (os.pathsep + pythonpath if pythonpath else ""))

    def follow_forks(self, session: Any) -> None:
        """Start a new session in each forked child of this process (`session`: the
        parent's, with a ``profiler``)."""
        global _current, _conf
        _current, _conf = session, self.conf
        _hook_forks()

    def merged(self, doc: Dict[str, Any], end_unix_s: Optional[float] = None
               ) -> Tuple[Dict[str, Any], List[str]]:
        """(the merge of the parent's `doc` and the children's parts, notes to say).
        Removes the directory: a child still running then writes no more."""
        from aioprof.report import merge

        end = time.time() if end_unix_s is None else end_unix_s
        doc = dict(doc, process=_process_info(True))
        docs, notes = [doc], []
        try:
            names = sorted(os.listdir(self.dir))
        except OSError:
            names = []
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                part = merge.load(os.path.join(self.dir, name))
            except merge.ReportError:
                continue
            if part.get("pid") == self.pid:
                continue
            if not (part.get("tasks") or part.get("loops") or part.get("coroutines")
                    or part.get("dropped_tasks")):
                continue        # a child that ran no asyncio (a forkserver, a tool): left out
            info = part.get("process") if isinstance(part.get("process"), dict) else {}
            if not info.get("final"):
                written = info.get("written_unix_s")
                ago = f"{max(0.0, end - written):.1f} s before the end" if isinstance(written, (int, float)) else "earlier"
                notes.append(f"process {part.get('pid')} did not write its final figures (still "
                             f"running, or killed): its part written {ago} is used")
            docs.append(part)
        shutil.rmtree(self.dir, ignore_errors=True)
        return (merge.merge(docs) if len(docs) > 1 else doc), notes


class _Writer:
    """A thread (invisible to `threading`) that writes the child's part every period;
    stopped before a fork (os.fork() on 3.12+ warns about other threads) and started
    again after it in the parent."""

    def __init__(self, child: "_Child", period_s: float) -> None:
        self.child, self.period_s = child, period_s
        self.stop_lock: Any = None
        self.done: Any = None

    def start(self) -> None:
        if self.period_s <= 0 or self.stop_lock is not None:
            return
        stop, done = _thread.allocate_lock(), _thread.allocate_lock()
        stop.acquire()
        done.acquire()
        self.stop_lock, self.done = stop, done
        try:
            _thread.start_new_thread(self._run, (stop, done))
        except RuntimeError:
            self.stop_lock = self.done = None

    def _run(self, stop: Any, done: Any) -> None:
        wait = self.period_s
        try:
            while not stop.acquire(timeout=wait):
                t = time.perf_counter()
                self.child.write(final=False)
                # A large report takes long to write: at most ~5% of the time goes to it.
                wait = max(self.period_s, 20 * (time.perf_counter() - t))
        except BaseException:
            pass
        finally:
            done.release()

    def stop(self) -> None:
        stop, done = self.stop_lock, self.done
        if stop is None:
            return
        self.stop_lock = self.done = None
        stop.release()
        done.acquire(timeout=2.0)


class _Child:
    """The session of a child process: profiles it and writes its part."""

    def __init__(self, conf: Dict[str, Any]) -> None:
        import aioprof

        self.conf = conf
        self.pid = os.getpid()
        self.path = os.path.join(conf["dir"], f"{self.pid}.json")
        self.final = False
        self.lock = _thread.allocate_lock()
        self.writing: Optional[int] = None   # the thread inside write()
        self.die_after = False               # a SIGTERM came during this thread's own write
        self.term_handler: Any = None
        self.profiler = aioprof.Profiler(**conf["kwargs"])
        self.writer = _Writer(self, float(conf.get("period_s") or 0))

    def start(self) -> None:
        self.profiler.start()
        atexit.register(self.finish)
        self.watch_sigterm()
        mp_util = sys.modules.get("multiprocessing.util")
        if mp_util is not None:   # its fork/forkserver children leave by os._exit
            mp_util.register_after_fork(self, _at_mp_exit)
        self.writer.start()

    def watch_sigterm(self, replace: Any = None) -> None:
        """Take SIGTERM if at its default action (or at `replace`, the parent's handler)."""
        from aioprof.cli import _TermHandler

        try:
            current = signal.getsignal(signal.SIGTERM)
            if current is signal.SIG_DFL or (replace is not None and current is replace):
                self.term_handler = _TermHandler(self)
                signal.signal(signal.SIGTERM, self.term_handler)
        except (ValueError, OSError, AttributeError):   # not the main thread
            self.term_handler = None

    def write(self, final: bool) -> None:
        """Write the part (final: stop the profiler first); a failure is ignored once
        the parent has ended (its directory is gone), else said once."""
        me = _thread.get_ident()
        if self.writing == me:   # a signal handler inside this thread's own write
            return
        with self.lock:
            if self.final or os.getpid() != self.pid:
                return
            self.writing = me
            try:
                with warnings.catch_warnings():   # the warnings are in the part
                    warnings.simplefilter("ignore")
                    if final:
                        self.final = True
                        self.profiler.stop()
                    doc = self.profiler.stats()
                doc["process"] = _process_info(final)
                _write_json(self.path, doc)
            except Exception as e:
                if final and os.path.isdir(self.conf["dir"]):
                    _say(f"warning: process {self.pid}: could not write its figures: "
                         f"{type(e).__name__}: {e}")
            finally:
                self.writing = None
        if self.die_after and final:
            self._die()

    def finish(self) -> None:
        if os.getpid() != self.pid:
            return
        self.writer.stop()
        self.write(final=True)

    def terminated(self) -> None:
        """SIGTERM at its default: the final part, then death by SIGTERM."""
        if os.getpid() == self.pid:
            if self.writing == _thread.get_ident():
                # It interrupts this thread's own write (e.g. the final one at exit, when
                # multiprocessing's Pool terminates its workers): die once that is done.
                self.die_after = True
                return
            self.finish()
        self._die()

    def _die(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(128 + signal.SIGTERM)

    def abandon(self) -> None:
        """In a forked child: this session is the parent's; drop it without a part."""
        self.final = True
        self.writer.stop_lock = self.writer.done = None   # the thread is the parent's
        atexit.unregister(self.finish)
        self.profiler._abandon()


def _at_mp_exit(child: _Child) -> None:
    """multiprocessing's after-fork hook (run in its child before the target): write the
    part at multiprocessing's exit, which ends with os._exit (no atexit)."""
    import multiprocessing.util

    current = _current
    if isinstance(current, _Child) and current.pid == os.getpid():
        multiprocessing.util.Finalize(None, current.finish, exitpriority=-1000)


def _say(message: str) -> None:
    try:
        stream = sys.__stderr__ or sys.stderr
        print(f"aioprof: {message}", file=stream, flush=True)
    except Exception:
        pass


def _before_fork() -> None:
    if isinstance(_current, _Child) and _current.pid == os.getpid():
        _current.writer.stop()


def _after_fork_parent() -> None:
    if isinstance(_current, _Child) and _current.pid == os.getpid():
        _current.writer.start()


def _after_fork_child() -> None:
    """A new session in the forked child; the copied one is the parent's."""
    global _current
    old, conf = _current, _conf
    if old is None or conf is None:
        return
    try:
        handler = getattr(old, "term_handler", None)
        if isinstance(old, _Child):
            old.abandon()
        else:   # the parent's cli._Session
            old.profiler._abandon()
        _current = None
        child = _Child(conf)
        _current = child
        child.start()
        if handler is not None:
            child.watch_sigterm(replace=handler)
    except Exception as e:
        _current = None
        _say(f"warning: --subprocesses: forked process {os.getpid()} is not profiled ({e})")


def _hook_forks() -> None:
    global _hooked
    if not _hooked:
        _hooked = True
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                            after_in_child=_after_fork_child)


def start_child(conf: Dict[str, Any]) -> None:
    """Profile this new interpreter (called by _boot/sitecustomize.py); a failure is
    said in one line and the program runs unprofiled."""
    global _current, _conf
    try:
        child = _Child(conf)
        child.start()
    except Exception as e:
        _say(f"warning: --subprocesses: process {os.getpid()} is not profiled ({e})")
        return
    _current, _conf = child, conf
    _hook_forks()
