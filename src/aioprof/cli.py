"""`python -m aioprof [options] (script.py | -m module | -c code) [args]`.

Runs the program as `python script.py args` / `python -m module args` / `python -c code
args` would (same
``sys.argv``, ``sys.path[0]``, ``__main__`` module and exit status) with the profiler on,
and writes the report to stderr or to ``-o FILE``. See docs/cli.md.

The report is written from an ``atexit`` handler registered before the program starts,
so it runs after the program's own exit handlers and after Python has waited for the
program's non-daemon threads: loops running in threads are measured to their end. An
uncaught KeyboardInterrupt leaves `main` as it leaves a script, so python itself prints
it, finalizes (unclosed files are flushed, ``__del__`` runs) and then dies of SIGINT.
SIGTERM at its default action writes the report and then dies of SIGTERM. The ``-o``
file is replaced only by a complete report (written beside it, then renamed).
"""
from __future__ import annotations

import argparse
import atexit
import builtins
import errno
import importlib.machinery
import importlib.util
import io
import os
import pkgutil
import re
import runpy
import signal
import stat
import sys
import traceback
import types
import warnings
from typing import IO, Any, Callable, List, NoReturn, Optional, Sequence, Tuple

import aioprof
from aioprof import report

__all__ = ["main"]

USAGE = "python -m aioprof [options] (script.py | -m module | -c code) [args ...]"
DESCRIPTION = ("Run a Python program under the aioprof asyncio profiler, then write the "
               "report (to stderr unless -o). Options go before the script, -m module or -c code; "
               "everything after it is passed to the program.")
EPILOG = ("Exit status: the program's, as python would give it; 2 when aioprof cannot "
          "start the program (bad option, missing script or module, unwritable -o file). "
          "`report` as the first argument re-renders saved JSON reports (report -h); "
          "`snapshot PID` gives the report of a running process started with --listen, "
          "as of now (docs/live.md); ./report or ./snapshot runs a script of that name. "
          "See docs/cli.md.")
REPORT_USAGE = ("python -m aioprof report FILE.json [FILE.json ...] [--format F] [-o OUT] "
                "[text options]")
REPORT_DESCRIPTION = ("Re-render reports saved with --format json, in any format whose data "
                      "they hold; several files are merged into one report (coroutines "
                      "summed, tasks and loops listed with their pid). Written to stdout "
                      "unless -o.")
REPORT_EPILOG = ("Exit status: 0; 2 for a bad option or a file that is not a readable "
                 "aioprof JSON report; 1 when the reports lack what the format needs "
                 "(samples for a cpu flame, the trace). See docs/cli.md.")
# Options that take a value as the next argument: needed to find where ours end.
_VALUE_OPTIONS = {"-o", "--output", "--format", "--sort", "--limit", "--by", "--max-tasks",
                  "--cpu-window", "--slow-ms", "--flame", "--interval", "--trace-buffer",
                  "--metrics"}
# Frames of these files sit between aioprof and the program: left out of tracebacks.
_OWN_FILES = {__file__, runpy.__file__, runpy.run_module.__code__.co_filename}


class _Error(Exception):
    """A problem found before the program runs: one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Error(message)


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


def _address(text: str) -> Tuple[str, int]:
    """HOST:PORT ([v6 address]:PORT) -> (host, port); the host is required."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(text)
    return host, int(port)


# argparse names the expected type from the function's __name__ in its messages.
_count.__name__ = "integer >= 0"
_at_least_one.__name__ = "integer >= 1"
_positive.__name__ = "number > 0"
_non_negative.__name__ = "number >= 0"
_address.__name__ = "HOST:PORT address (e.g. 127.0.0.1:9464)"


def _parser() -> _Parser:
    p = _Parser(prog="aioprof", usage=f"{USAGE}\n       {REPORT_USAGE}", description=DESCRIPTION,
                epilog=EPILOG, allow_abbrev=False)
    p.add_argument("script", nargs="?", help="the program to run; its arguments follow it")
    p.add_argument("-m", dest="module", metavar="MODULE",
                   help="run a module as a script, like python -m (ends aioprof's options)")
    p.add_argument("-c", dest="code", metavar="CODE",
                   help="run the program passed as a string, like python -c (ends aioprof's "
                        "options)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the report to FILE (UTF-8) instead of stderr; - for stdout")
    p.add_argument("--format", choices=report.FORMATS, default="text",
                   help="text tables (default), the JSON document of docs/json.md, folded "
                        "stacks for flame graphs (collapsed), Chrome trace-event JSON "
                        "for Perfetto (trace) or a gzipped pprof profile for go tool "
                        "pprof, Pyroscope and Parca (pprof; binary, needs -o), or one "
                        "self-contained page with tables, flame graphs and the timeline "
                        "(html; docs/html.md)")
    p.add_argument("--trace", action="store_true",
                   help="record the trace (every step, wait and tick: the timeline of "
                        "--format html, or kept in --format json); on with --format trace")
    p.add_argument("--flame", choices=report.FLAMES, default="cpu",
                   help="with --format collapsed: sampled on-loop time (cpu, default), "
                        "await time (idle) or both (wall), in microseconds")
    p.add_argument("--sort", choices=report.SORTS, default="busy",
                   help="sort the tables by this time (descending; max = longest step); "
                        "default busy")
    p.add_argument("--limit", type=_count, default=None, metavar="N",
                   help=f"rows of the main table, or children per node of the --by stack "
                        f"tree (default {report.text.DEFAULT_LIMIT}; 0 = all)")
    p.add_argument("--by", choices=report.VIEWS, default="coroutine",
                   help="main table: per coroutine function (default), per task, per await "
                        "site, per callback, the sampled time as a call tree (stack), or "
                        "per process (with --subprocesses)")
    p.add_argument("--show-internal", action="store_true",
                   help="include asyncio's own tasks, coroutines and callbacks")
    p.add_argument("--max-tasks", type=_count, default=10000, metavar="N",
                   help="per-task records kept (default 10000); later tasks still count in "
                        "the per-coroutine figures")
    p.add_argument("--cpu-window", type=_positive, default=1.0, metavar="MS",
                   help="read the thread CPU clock at most once per MS milliseconds "
                        "(default 1.0)")
    p.add_argument("--slow-ms", type=_non_negative, default=100.0, metavar="MS",
                   help="record steps and callbacks of at least MS milliseconds as slow "
                        "(default 100)")
    p.add_argument("--interval", type=_non_negative, default=None, metavar="MS",
                   help="sample the running stack about every MS milliseconds (0 = no "
                        "sampling). Default: 1.0 with --flame cpu/wall or --by stack, "
                        "else off (docs/stacks.md: the sampler's limits)")
    p.add_argument("--trace-buffer", type=_at_least_one, default=200000, metavar="N",
                   help="with --format trace or --trace: keep the newest N trace events (default "
                        "200000)")
    p.add_argument("--metrics", type=_address, default=None, metavar="HOST:PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics while the "
                        "program runs (needs prometheus_client; docs/prometheus.md)")
    p.add_argument("--listen", nargs="?", const="unix", default=None, metavar="HOST:PORT",
                   help="serve the figures while the program runs, to `python -m aioprof "
                        "snapshot PID` of the same user, on a Unix socket only this user can "
                        "reach (docs/live.md); with 127.0.0.1:PORT on a loopback TCP port "
                        "instead, each request carrying the token printed on stderr")
    p.add_argument("--subprocesses", action="store_true",
                   help="profile the program's child processes too (fork, multiprocessing, "
                        "subprocess running Python) and merge their figures into the "
                        "report; --by process shows one row per process")
    p.add_argument("--version", action="version", version=f"aioprof {aioprof.__version__}")
    return p


def _report_parser() -> _Parser:
    p = _Parser(prog="aioprof report", usage=REPORT_USAGE, description=REPORT_DESCRIPTION,
                epilog=REPORT_EPILOG, allow_abbrev=False)
    p.add_argument("files", nargs="+", metavar="FILE.json", help="reports written by --format json")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the report to FILE instead of stdout (replaced only when complete)")
    p.add_argument("--format", choices=report.FORMATS, default="text",
                   help="text (default), json (the merged document), collapsed, trace, html or pprof "
                        "(binary: -o FILE or a pipe), as for a run")
    p.add_argument("--flame", choices=report.FLAMES, default="cpu",
                   help="with --format collapsed: cpu (default), idle or wall")
    p.add_argument("--sort", choices=report.SORTS, default="busy", help="as for a run")
    p.add_argument("--limit", type=_count, default=None, metavar="N", help="as for a run")
    p.add_argument("--by", choices=report.VIEWS, default="coroutine", help="as for a run")
    p.add_argument("--show-internal", action="store_true", help="as for a run")
    return p


def report_main(argv: Sequence[str]) -> NoReturn:
    """`python -m aioprof report FILE.json [...]`: re-render saved JSON reports (merged
    when several) in any format; ends with SystemExit (0; 2 for a bad option or file; 1
    when the reports lack what the format needs)."""
    from aioprof.report import merge

    try:
        opts = _report_parser().parse_args(argv)
        _check_binary(opts.format, opts.output)
        if opts.output is not None and opts.output != "-":
            _check_writable(opts.output)
        docs = [merge.load(path) for path in opts.files]
    except (_Error, merge.ReportError) as e:
        hint = ""
        if isinstance(e, _Error) and os.path.isfile("report"):
            hint = " (to run the script named report, write ./report)"
        _say(f"error: {e}{hint}")
        raise SystemExit(2) from None
    ignored = _ignored(argv, opts)
    if ignored:
        _say(f"warning: {' and '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} nothing "
             f"with --format {opts.format}")
    doc = merge.merge(docs)

    def render(file: IO[str]) -> None:
        if opts.format == "text" and opts.by == "stack" and not isinstance(doc.get("samples"), dict):
            raise ValueError("no samples in the report for --by stack: the run did not sample "
                             "(it does with --by stack or --interval MS)")
        report.write(doc, format=opts.format, file=file, sort=opts.sort, limit=opts.limit,
                     by=opts.by, show_internal=opts.show_internal, flame=opts.flame)

    try:
        if opts.output is not None and opts.output != "-":
            write_atomically(opts.output, render)
        else:
            render(sys.stdout)
            sys.stdout.flush()
    except ValueError as e:
        what = opts.files[0] if len(opts.files) == 1 else f"these {len(opts.files)} reports"
        _say(f"error: cannot write --format {opts.format} from {what}: {e}")
        raise SystemExit(1) from None
    except BrokenPipeError:   # `... | head`: the reader has what it wanted
        _reader_gone()
        raise SystemExit(1) from None
    except OSError as e:
        _say(f"error: could not write the report: {e}")
        raise SystemExit(1) from None
    note = report.trace.dropped_note(doc) if opts.format == "trace" else None
    if note:
        _say(note)
    raise SystemExit(0)


def _split(argv: Sequence[str]) -> Tuple[List[str], Optional[str], Optional[str], List[str]]:
    """Split argv into (aioprof's options, "script", "module" or "code", target, program
    args).

    aioprof's options end at the first argument that is not an option (the script), at
    ``-m MODULE`` (or ``-mMODULE``), at ``-c CODE`` (or ``-cCODE``) or after ``--``; all
    that follows is the program's.
    """
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest = list(argv[i + 1:])
            return list(argv[:i]), ("script" if rest else None), (rest[0] if rest else None), rest[1:]
        for flag, kind in (("-m", "module"), ("-c", "code")):
            if arg == flag:
                if i + 1 == len(argv):
                    raise _Error(f"argument {flag}: expected " + ("a module name" if kind == "module" else "one argument"))
                return list(argv[:i]), kind, argv[i + 1], list(argv[i + 2:])
            if arg.startswith(flag):
                return list(argv[:i]), kind, arg[2:], list(argv[i + 1:])
        if arg.startswith("-") and arg != "-":
            i += 2 if arg in _VALUE_OPTIONS or _listen_address_follows(argv, i) else 1
            continue
        return list(argv[:i]), "script", arg, list(argv[i + 1:])
    return list(argv), None, None, []


def _listen_address_follows(argv: Sequence[str], i: int) -> bool:
    """True when argv[i] is ``--listen`` and the next argument is its HOST:PORT (not a
    file): ``--listen`` alone takes no value, so ``--listen app.py`` runs app.py."""
    if argv[i] != "--listen" or i + 1 >= len(argv):
        return False
    nxt = argv[i + 1]
    return bool(re.fullmatch(r"[\w.\-\[\]:]*:\d+", nxt)) and not os.path.exists(nxt)


def _exit_status(code: Any) -> int:
    """The exit status Python gives ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    return 1


def _usable(stream: Optional[IO[str]]) -> bool:
    return stream is not None and not getattr(stream, "closed", False)


def _flush(*streams: Optional[IO[str]]) -> None:
    for stream in streams:
        try:
            if _usable(stream):
                stream.flush()  # type: ignore[union-attr]
        except Exception:
            pass


def _stderr() -> IO[str]:
    """The process's stderr, even if the program replaced sys.stderr (else sys.stderr)."""
    return sys.__stderr__ if _usable(sys.__stderr__) else sys.stderr


def _say(message: str) -> None:
    """One line on stderr; never raises."""
    try:
        print(f"aioprof: {message}", file=_stderr(), flush=True)
    except Exception:
        pass


def _program_traceback(exc: BaseException) -> Optional[types.TracebackType]:
    """The traceback of an exception caught in main(), from the program's first frame."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return tb


class _ProgramExcepthook:
    """sys.excepthook while the program's KeyboardInterrupt leaves main(): python prints
    it through `hook` (the program's excepthook, or the default one) with the traceback
    the program would show, then this puts `hook` back."""

    def __init__(self, exc: BaseException, hook: Callable[..., Any]) -> None:
        self.exc, self.tb, self.hook = exc, _program_traceback(exc), hook

    def __call__(self, typ: type, value: BaseException, tb: Optional[types.TracebackType]) -> None:
        if sys.excepthook is self:
            sys.excepthook = self.hook
        if value is self.exc:
            value.__traceback__ = tb = self.tb
        self.hook(typ, value, tb)


def _print_exception(exc: BaseException) -> None:
    """Print an exception of the program as Python would, without aioprof's frames."""
    exc.__traceback__ = tb = _program_traceback(exc)
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:
        traceback.print_exception(type(exc), exc, tb)


class _Program:
    """The program to run: a script file, a directory/zip with __main__.py, or a module."""

    def __init__(self, kind: str, target: str, args: List[str]) -> None:
        self.kind, self.target, self.args = kind, target, args
        self.source: Optional[bytes] = None
        self.main_spec: Optional[importlib.machinery.ModuleSpec] = None   # dir or zip

    def find(self) -> None:
        """Check that the program exists (raises _Error); a module is looked up on sys.path."""
        if self.kind == "module":
            self._find_module()
        elif self.kind == "code":
            self.argv0 = "-c"
            self.source = self.target.encode("utf-8", "surrogateescape")
        else:
            self._find_script()

    def _find_script(self) -> None:
        path = self.target
        self.path = os.path.abspath(path)
        self.argv0 = path
        # A directory or zip file runs its __main__ module, like python does.
        importer = pkgutil.get_importer(self.path) if os.path.exists(self.path) else None
        if importer is not None:
            self.main_spec = importer.find_spec("__main__")  # type: ignore[union-attr]
            if self.main_spec is None or self.main_spec.loader is None:
                raise _Error(f"can't find '__main__' module in {path!r}")
            return
        try:
            with io.open_code(self.path) as f:
                self.source = f.read()
        except OSError as e:
            raise _Error(f"can't open file {self.path!r}: [Errno {e.errno}] {e.strerror}") from None

    def _find_module(self) -> None:
        name = self.target
        if not name:
            raise _Error("argument -m: expected a module name")
        try:
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations is not None:
                main_spec = importlib.util.find_spec(name + ".__main__")
                if main_spec is None:
                    raise _Error(f"No module named {name}.__main__; {name!r} is a package and "
                                 f"cannot be directly executed")
                spec = main_spec
        except _Error:
            raise
        except Exception as e:
            raise _Error(f"Error while finding module specification for {name!r} "
                         f"({type(e).__name__}: {e})") from None
        if spec is None:
            raise _Error(f"No module named {name}")
        self.argv0 = spec.origin or name

    def set_path(self) -> None:
        """Set sys.path[0] as python would for this program (call find() first)."""
        # Under -I or -P, python adds neither the script's directory nor the cwd.
        if sys.flags.isolated or getattr(sys.flags, "safe_path", False) or not sys.path:
            return
        if self.kind == "module":
            sys.path[0] = os.getcwd()
        elif self.kind == "code":
            sys.path[0] = ""
        elif self.main_spec is not None:
            sys.path[0] = self.path
        else:
            sys.path[0] = os.path.dirname(os.path.realpath(self.path))

    def set_argv(self) -> None:
        sys.argv[:] = [self.argv0, *self.args]

    def run(self) -> None:
        if self.kind == "module":
            runpy.run_module(self.target, run_name="__main__", alter_sys=True)
            return
        # Not runpy.run_path: it sets sys.argv[0] to the path it is given, but python keeps
        # argv[0] as typed while __file__, sys.path[0] and code paths are absolute.
        spec = self.main_spec
        if self.kind == "code":     # python -c: no __file__, the built-in importer as loader
            assert self.source is not None
            code = compile(self.source, "<string>", "exec", dont_inherit=True)
            if sys.version_info >= (3, 13):   # 3.13's python -c: tracebacks show the lines
                import linecache

                lines = self.target.splitlines()
                linecache.cache["<string>"] = (len(self.target), None, [f"{line}\n" for line in lines], "<string>")
            main = types.ModuleType("__main__")
            main.__dict__.update(__loader__=importlib.machinery.BuiltinImporter)
        elif spec is not None:
            assert spec.loader is not None
            code = spec.loader.get_code("__main__")  # type: ignore[attr-defined]
            main = importlib.util.module_from_spec(spec)
        else:
            assert self.source is not None
            code = compile(self.source, self.path, "exec", dont_inherit=True)
            main = types.ModuleType("__main__")
            main.__dict__.update(
                __file__=self.path,
                __loader__=importlib.machinery.SourceFileLoader("__main__", self.path))
            if sys.version_info < (3, 15):   # (3.15 no longer sets __cached__)
                main.__dict__["__cached__"] = None
        # The globals python gives __main__; a real module, so that pickle and
        # multiprocessing find what the program defines. (3.14 evaluates annotations
        # lazily: no __annotations__ global, the code itself defines __annotate__.)
        main.__dict__["__builtins__"] = builtins
        if sys.version_info < (3, 14):
            main.__dict__["__annotations__"] = {}
        sys.modules["__main__"] = main
        exec(code, main.__dict__)


def _temp_name(path: str) -> str:
    """The temporary file beside `path` that write_atomically renames over it."""
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}.{os.getpid()}.aioprof-tmp")


def write_atomically(path: str, write: Callable[[IO[str]], None]) -> None:
    """Write the text file `path` (UTF-8) with ``write(stream)``, replacing it only once
    complete: the text goes to a new file beside it (same directory, hidden temporary
    name, the old file's permissions) that is then renamed over it, so a run that writes
    nothing, or is killed while writing, leaves the earlier file as it was. A path that is
    not a regular file (``/dev/null``, a FIFO, a terminal) is opened and written in place.
    On an error the temporary file is removed and the error propagates."""
    path = os.path.realpath(path)      # through a symlink: replace its target, not the link
    try:
        st: Optional[os.stat_result] = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with open(path, "w", encoding="utf-8") as f:
            write(f)
        return
    tmp = _temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
        with open(fd, "w", encoding="utf-8", closefd=True) as f:
            fd = -1
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _check_writable(path: str) -> None:
    """Raise _Error unless `write_atomically(path, ...)` will be able to write there,
    without touching `path` itself: an earlier report stays until the new one replaces it."""
    real = os.path.realpath(path)
    try:
        if os.path.isdir(real):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        if os.path.exists(real) and not os.access(real, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        if os.path.exists(real) and not os.path.isfile(real):
            return        # /dev/null, a FIFO...: written in place at the end
        probe = _temp_name(real)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as e:
        raise _Error(f"cannot write the report to {path!r}: {e.strerror or e}") from None


class _TermHandler:
    """aioprof's SIGTERM handler while the program leaves SIGTERM at its default: writes
    the report, then ends the process with SIGTERM's default action.

    ``signal.getsignal(SIGTERM)`` returns it (not SIG_DFL). A program that saves the
    handler it finds and puts it back before re-raising the signal (uvicorn) puts this
    one back, so the report is still written. (An object equal to SIG_DFL would be turned
    into SIG_DFL by `signal.getsignal`, and a program restoring it would lose the report.)"""

    def __init__(self, session: "_Session") -> None:
        self.session = session

    def __call__(self, signum: int, frame: Any) -> None:
        self.session.terminated()

    def __repr__(self) -> str:
        return "<aioprof: write the report, then SIGTERM's default action>"


class _Session:
    """Profiles the program and writes the report once, at interpreter exit (or at a
    SIGTERM left at its default)."""

    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.pid = os.getpid()
        self.written = False
        self.term_handler: Optional[_TermHandler] = None
        self.profiler = aioprof.Profiler(**_profiler_kwargs(opts))
        self.parent: Any = None   # aioprof.subprocesses.Parent with --subprocesses

    def follow_subprocesses(self) -> None:
        from aioprof import subprocesses

        self.parent = subprocesses.Parent(_profiler_kwargs(self.opts))
        self.parent.follow_forks(self)

    def watch_sigterm(self) -> None:
        """Take SIGTERM if it is at its default action (not if ignored or handled)."""
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                self.term_handler = _TermHandler(self)
                signal.signal(signal.SIGTERM, self.term_handler)
        except (ValueError, OSError, AttributeError):   # not the main thread; no SIGTERM
            self.term_handler = None

    def finish(self) -> None:
        """atexit: stop the profiler and write the report. The exit status stays the
        program's: a report that cannot be written is said on stderr, nothing more."""
        if os.getpid() != self.pid or self.written:   # a forked child exiting through sys.exit
            return
        self._report(flush=True)
        if self.term_handler is not None and signal.getsignal(signal.SIGTERM) is self.term_handler:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def terminated(self) -> None:
        """SIGTERM at its default: write the report (once), then die of SIGTERM without
        running the program's exit handlers or flushing its buffers, as python would."""
        if os.getpid() == self.pid and not self.written:
            self._report(flush=False)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(128 + signal.SIGTERM)   # not reached: SIGTERM's default action ends us

    def _report(self, flush: bool) -> None:
        self.written = True
        try:
            self._write(flush)
        except BrokenPipeError:   # -o - | head: the reader has what it wanted
            _reader_gone(sys.stdout if self.opts.output == "-" else _stderr())
        except BaseException as e:
            _say(f"error: could not write the report: {type(e).__name__}: {e}")

    def _write(self, flush: bool) -> None:
        with warnings.catch_warnings():   # the warnings are in the report
            warnings.simplefilter("ignore")
            self.profiler.stop()
            doc = self.profiler.stats()
        notes: List[str] = []
        if self.parent is not None:
            doc, notes = self.parent.merged(doc)
        o = self.opts

        def render(file: IO[str]) -> None:
            report.write(doc, format=o.format, file=file, sort=o.sort, limit=o.limit, by=o.by,
                         show_internal=o.show_internal, flame=o.flame)

        if o.output is not None and o.output != "-":
            write_atomically(o.output, render)
        else:
            file = sys.stdout if o.output == "-" else _stderr()
            if flush or o.output == "-":
                _flush(sys.stdout, sys.stderr)
            render(file)
            file.flush()
        note = report.trace.dropped_note(doc)   # silent drops were issue 7, item 11
        for line in notes + ([note] if note else []):
            _say(line)


def _reader_gone(stream: Optional[IO[str]] = None) -> None:
    """The pipe the report went into (`stream`, default stdout) was closed by its reader
    (`| head`): no error, and the stream's descriptor points at /dev/null, so that the
    interpreter's flush at exit raises no second BrokenPipeError (Python's documented
    way, "Note on SIGPIPE"). Other streams are left alone."""
    stream = sys.stdout if stream is None else stream
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    os.close(devnull)


def _interval_ms(opts: argparse.Namespace) -> float:
    """--interval, or its default: sampling on only for the views made of samples."""
    if opts.interval is not None:
        return opts.interval
    wants_samples = ((opts.format == "collapsed" and opts.flame in ("cpu", "wall"))
                     or opts.format in ("pprof", "html") or opts.by == "stack")
    return 1.0 if wants_samples else 0.0


def _profiler_kwargs(opts: argparse.Namespace) -> dict:
    """The keyword arguments of aioprof.Profiler for the options."""
    return {"max_tasks": opts.max_tasks, "cpu_window_ms": opts.cpu_window,
            "slow_ms": opts.slow_ms, "interval_ms": _interval_ms(opts),
            "async_stacks": opts.format in ("collapsed", "html") or opts.by == "stack",
            "trace": opts.format == "trace" or opts.trace, "trace_buffer": opts.trace_buffer,
            "listen": opts.listen}   # None: AIOPROF_LISTEN decides


def _check(opts: argparse.Namespace, options: Sequence[str] = ()) -> None:
    """Option combinations that cannot give a report (raises _Error); `options`: the
    options as written."""
    if opts.listen is not None:
        from aioprof.live import ListenError, listen_target

        try:
            listen_target(opts.listen, source="--listen")
        except (ListenError, ValueError) as e:
            raise _Error(str(e)) from None
    if opts.format == "collapsed" and opts.flame in ("cpu", "wall") and _interval_ms(opts) == 0:
        raise _Error(f"argument --interval: 0 turns sampling off, but --format collapsed "
                     f"--flame {opts.flame}{'' if '--flame' in _given(options) else ' (its default)'} "
                     f"needs samples (--flame idle needs none)")
    _check_binary(opts.format, opts.output)


def _check_binary(format: str, output: Optional[str]) -> None:
    """A binary format goes to -o FILE, or to -o - when stdout is not a terminal (raises
    _Error), never to stderr."""
    if format == "html" and output is None and report._is_terminal(sys.stderr):
        raise _Error("--format html writes a whole page: give -o FILE.html (or -o - into a "
                     "pipe), not to a terminal")
    if format not in report.BINARY_FORMATS:
        return
    if output is None:
        raise _Error(f"--format {format} is binary: give -o FILE (or -o - into a pipe)")
    if output == "-" and report._is_terminal(sys.stdout):
        raise _Error(f"--format {format} is binary: not written to a terminal; give -o FILE "
                     f"or pipe stdout")


def _given(options: Sequence[str]) -> List[str]:
    """The names of the options written in `options` (aioprof's part of argv)."""
    names, i = [], 0
    while i < len(options):
        arg = options[i]
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
        if arg.startswith("-"):
            names.append(name)
        takes_next = name in _VALUE_OPTIONS and "=" not in arg and (arg.startswith("--") or len(arg) == 2)
        i += 2 if takes_next else 1
    return names


def _ignored(options: Sequence[str], opts: argparse.Namespace) -> List[str]:
    """The options given that do nothing in the chosen --format (checked all the same)."""
    text_only = {"--sort", "--limit", "--show-internal"}
    if not (opts.by == "stack" and opts.format in ("json", "trace")):   # --by stack records stacks
        text_only.add("--by")
    ignored = []
    for name in dict.fromkeys(_given(options)):
        if ((name in text_only and opts.format != "text")
                or (name == "--flame" and opts.format != "collapsed")
                or (name == "--trace-buffer" and opts.format != "trace" and not getattr(opts, "trace", False))):
            ignored.append(name)
    return ignored


def _setup(argv: Sequence[str]) -> Tuple[_Program, _Session]:
    """Parse argv and check everything that can fail before the program starts."""
    options, kind, target, args = _split(argv)
    opts = _parser().parse_args(options)
    _check(opts, options)
    ignored = _ignored(options, opts)
    if ignored:
        _say(f"warning: {' and '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} nothing "
             f"with --format {opts.format}; the run goes on")
    if kind is None:
        raise _Error("no script, -m module or -c code given (usage: " + USAGE + ")")
    program = _Program(kind, target or "", args)
    if kind == "module":     # a module is found on the sys.path it will run with
        program.set_path()
        program.find()
    else:
        program.find()
        program.set_path()
    if opts.output is not None and opts.output != "-":
        if kind == "script" and os.path.exists(opts.output) and os.path.samefile(opts.output, program.path):
            raise _Error(f"-o {opts.output!r} is the script itself; the report would overwrite it")
        _check_writable(opts.output)
        # Where the report goes, fixed now: the program may change its directory.
        opts.output = os.path.abspath(opts.output)
    try:
        session = _Session(opts)
    except Exception as e:
        raise _Error(str(e)) from None
    if opts.metrics is not None:
        _serve_metrics(opts.metrics, session.profiler)
    if opts.subprocesses:
        try:
            session.follow_subprocesses()
        except OSError as e:
            raise _Error(f"--subprocesses: cannot make the parts directory: {e}") from None
    return program, session


def _serve_metrics(address: Tuple[str, int], profiler: "aioprof.Profiler") -> None:
    """Serve the profiler's metrics on http://HOST:PORT/metrics from prometheus_client's
    HTTP server, in its daemon thread; raises _Error if that cannot be (no
    prometheus_client, an address that cannot be bound)."""
    host, port = address
    try:
        from prometheus_client import CollectorRegistry, start_http_server

        from aioprof.metrics import ProfilerCollector
    except ImportError as e:
        raise _Error(f"--metrics needs prometheus_client, which cannot be imported here "
                     f"({e}; pip install prometheus-client)") from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProfilerCollector(profiler))
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        start_http_server(port, addr=host, registry=registry)
    except (OSError, ValueError, OverflowError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise _Error(f"argument --metrics: cannot serve on {shown}: {reason}") from None


def _snapshot_command(argv: Sequence[str]) -> int:
    """`python -m aioprof snapshot PID ...` (aioprof.live.client)."""
    from aioprof.live.client import snapshot_main

    return snapshot_main(argv)


# Sub-commands: a first argument with one of these names is the command, not a script
# (a script of that name runs as ./NAME).
_COMMANDS: "dict[str, Callable[[Sequence[str]], int]]" = {"snapshot": _snapshot_command, "report": report_main}


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    """Run the command line `argv` (default sys.argv[1:]); ends with SystemExit, or with
    the program's uncaught KeyboardInterrupt.

    The exit status is the program's, as python would give it (sys.exit codes pass
    through, 1 after an uncaught exception; after KeyboardInterrupt python prints it,
    finalizes and dies of SIGINT; SIGTERM at its default: death by SIGTERM after the
    report); 2 for a usage error before the program starts.

    A first argument of exactly ``report`` or ``snapshot`` is that subcommand instead
    (`report_main`, `aioprof.live.client.snapshot_main`).
    """
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] in _COMMANDS:
        raise SystemExit(_COMMANDS[argv[0]](argv[1:]))
    try:
        program, session = _setup(argv)
        program.set_argv()
        atexit.register(session.finish)
        # The command line imports asyncio before the program (Profiler.start() would wait
        # for the program's own import): an asyncio imported during the program changes
        # the order in which finalization after Ctrl-C frees the program's objects
        # (test_signals.py::test_sigint_finalizes_like_python).
        import asyncio  # noqa: F401
        try:
            session.profiler.start()
        except Exception as e:
            atexit.unregister(session.finish)
            raise _Error(f"cannot start the profiler: {e}") from None
    except _Error as e:
        _say(f"error: {e}")
        raise SystemExit(2) from None

    session.watch_sigterm()
    try:
        program.run()
    except SystemExit:
        raise
    except KeyboardInterrupt as e:
        # Leave as the program's own KeyboardInterrupt would leave python: python prints
        # it (through sys.excepthook, shown from the program's first frame), finalizes
        # (flushing unclosed files, running __del__ and asyncio's never-retrieved logs),
        # runs the report's atexit handler, and only then dies of SIGINT.
        sys.excepthook = _ProgramExcepthook(e, sys.excepthook)
        raise
    except BaseException as e:
        _print_exception(e)
        raise SystemExit(1) from None
    raise SystemExit(0)
