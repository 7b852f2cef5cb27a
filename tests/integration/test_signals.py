"""`python -m aioprof` ended by a signal ends as plain `python` does (docs/cli.md, "Exit
status"): a real SIGINT lets the interpreter finalize (files flushed, ``__del__`` run,
asyncio's never-retrieved log) before dying of SIGINT; SIGTERM at its default writes the
report, then dies of SIGTERM; a program's own SIGTERM handling (exit 0, or uvicorn's
save, restore and re-raise) is unchanged and the report is still written; the ``-o``
file is only ever replaced by a complete report."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

from conftest import _import_root

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals are POSIX")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_import_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("PYTHONSAFEPATH", None)
    return env


def _default_signals() -> None:
    # A harness run in the background ignores SIGINT, and its children inherit that.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_until_ready(cwd: Path, args: Sequence[str], sig: Optional[int],
                    aioprof: Optional[Sequence[str]] = None) -> Tuple[int, bytes, bytes]:
    """Start `python [-m aioprof *aioprof] *args`, wait for its line "ready", send it
    `sig` (None: none), and return (returncode, stdout after "ready", stderr)."""
    cmd = [sys.executable] + (["-m", "aioprof", *aioprof] if aioprof is not None else []) + list(args)
    with subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=_default_signals) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first == b"ready\n", (first, proc.stderr.read() if proc.stderr else b"")
        if sig is not None:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def report_tasks(path: Path, coroutine: str) -> List[dict]:
    return [t for t in json.loads(path.read_text(encoding="utf-8"))["tasks"] if t["coroutine"] == coroutine]


# -- SIGINT: finalize first, then die of SIGINT ----------------------------------------------
CTRL_C = """\
    import asyncio, sys
    data = open(sys.argv[1], "w")      # never closed: python writes its buffer at finalization
    data.write("buffered line\\n")

    class Noisy:
        def __del__(self):
            print("Noisy.__del__ ran", file=sys.stderr)

    keep = Noisy()

    async def fail():
        raise ValueError("never retrieved")

    async def serve():
        global lost
        lost = asyncio.get_running_loop().create_task(fail())
        await asyncio.sleep(0)
        print("ready", flush=True)
        await asyncio.sleep(60)

    asyncio.run(serve())
"""


@pytest.fixture(scope="module")
def ctrl_c(tmp_path_factory):
    """The same program interrupted by a real SIGINT, plainly and under aioprof -o."""
    tmp = tmp_path_factory.mktemp("ctrl_c")
    write(tmp / "prog.py", CTRL_C)
    plain = run_until_ready(tmp, ["prog.py", "plain.txt"], signal.SIGINT)
    prof = run_until_ready(tmp, ["prog.py", "prof.txt"], signal.SIGINT,
                           aioprof=["-o", "report.json", "--format", "json"])
    return tmp, plain, prof


def split_at_interrupt(stderr: bytes) -> Tuple[bytes, bytes]:
    """(the KeyboardInterrupt traceback, what finalization wrote after it)."""
    head, sep, rest = stderr.partition(b"\nKeyboardInterrupt\n")
    assert sep, stderr
    return head + sep, rest


def same_traceback(prof: bytes, plain: bytes) -> bool:
    """On 3.11+ asyncio.run raises the KeyboardInterrupt itself: the same traceback. On
    3.10 it is raised wherever the signal found the loop: compare the outer frames."""
    assert b"runpy" not in prof and b"aioprof" not in prof, prof
    if sys.version_info >= (3, 11):
        return prof == plain
    frames = lambda tb: tb.split(b"\n")[:3]   # noqa: E731  header, the script's asyncio.run line
    return frames(prof) == frames(plain)


def test_sigint_finalizes_like_python(ctrl_c):
    tmp, plain, prof = ctrl_c
    # What python gives: the unclosed file's buffer, __del__'s line and asyncio's log.
    assert (tmp / "plain.txt").read_text() == "buffered line\n"
    plain_tb, plain_final = split_at_interrupt(plain[2])
    assert b"Noisy.__del__ ran" in plain_final and b"Task exception was never retrieved" in plain_final
    assert (tmp / "prof.txt").read_text() == (tmp / "plain.txt").read_text()
    prof_tb, prof_final = split_at_interrupt(prof[2])    # the report is in -o
    # A debug build shows the unclosed file's ResourceWarning, which names it.
    prof_final = prof_final.replace(b"'prof.txt'", b"'plain.txt'")
    if sys.version_info[:2] == (3, 11):
        # 3.11 only: the interpreter's teardown frees the task and the Noisy object in
        # the other order under the runner (not under 3.10, 3.12, 3.13).
        assert sorted(prof_final.splitlines()) == sorted(plain_final.splitlines())
    else:
        assert prof_final == plain_final
    assert same_traceback(prof_tb, plain_tb)
    assert prof[1] == plain[1]
    assert plain[0] == prof[0] == -signal.SIGINT


def test_sigint_still_writes_the_report(ctrl_c):
    tmp, _, _ = ctrl_c
    (task,) = report_tasks(tmp / "report.json", "serve")
    # 3.11+: asyncio.run cancels the main task on SIGINT; 3.10: KeyboardInterrupt fails it.
    assert task["state"] in ("cancelled", "failed")
    (failed,) = report_tasks(tmp / "report.json", "fail")
    assert failed["state"] == "failed" and failed["exception"] == "ValueError"


def test_sigint_traceback_and_report_on_stderr(tmp_path):
    # Without -o the report follows python's traceback on stderr, before finalization's
    # output; the traceback itself has no aioprof or runpy frame.
    write(tmp_path / "prog.py", CTRL_C)
    plain = run_until_ready(tmp_path, ["prog.py", "a.txt"], signal.SIGINT)
    prof = run_until_ready(tmp_path, ["prog.py", "b.txt"], signal.SIGINT, aioprof=[])
    assert prof[0] == -signal.SIGINT
    head, sep, rest = prof[2].partition(b"aioprof: wall ")
    assert sep and same_traceback(head, split_at_interrupt(plain[2])[0])
    assert b"Noisy.__del__ ran" in rest
    assert (tmp_path / "b.txt").read_text() == "buffered line\n"


# -- SIGTERM -------------------------------------------------------------------------------
SERVER = """\
    import asyncio, signal, sys
    mode = sys.argv[1]
    if mode == "own":                     # the program's own handler ends it with status 0
        def bye(signum, frame):
            print("own handler", flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, bye)

    async def serve():
        if mode == "uvicorn":             # uvicorn's capture_signals: save, restore, re-raise
            captured = []
            original = signal.signal(signal.SIGTERM, lambda signum, frame: captured.append(signum))
            print("ready", flush=True)
            while not captured:
                await asyncio.sleep(0.01)
            print("shutting down", flush=True)
            signal.signal(signal.SIGTERM, original)
            for signum in captured:
                signal.raise_signal(signum)
            print("not reached")
            return
        print("ready", flush=True)
        if mode == "default":
            print("never flushed")        # lost with the process, as under plain python
        # Short sleeps, not one of 60 s: a SIGTERM that arrives after the loop's last
        # check for signals and before it enters select runs the Python handler only when
        # select returns (CPython's race without a wakeup fd; aioprof's select hook makes
        # the window a little wider, and a loaded machine can preempt there).
        for _ in range(1200):
            await asyncio.sleep(0.05)

    asyncio.run(serve())
"""


@pytest.fixture(scope="module")
def sigterm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sigterm")
    write(tmp / "server.py", SERVER)
    runs = {}
    for mode in ("default", "own", "uvicorn"):
        (tmp / f"{mode}.json").write_text("an earlier report\n")
        runs[mode] = (run_until_ready(tmp, ["server.py", mode], signal.SIGTERM),
                      run_until_ready(tmp, ["server.py", mode], signal.SIGTERM,
                                      aioprof=["-o", f"{mode}.json", "--format", "json"]))
    return tmp, runs


@pytest.mark.parametrize("mode, status", [("default", -signal.SIGTERM), ("own", 0),
                                          ("uvicorn", -signal.SIGTERM)])
def test_sigterm_ends_like_python_and_writes_the_report(sigterm, mode, status):
    tmp, runs = sigterm
    plain, prof = runs[mode]
    assert plain[0] == prof[0] == status
    assert prof[1] == plain[1]
    assert prof[2] == plain[2] == b""
    (task,) = report_tasks(tmp / f"{mode}.json", "serve")
    # Ended inside a step (default: right after "ready"; uvicorn: in the step that
    # re-raises), or by SystemExit raised in it (own: asyncio.run cancels it on 3.11+).
    if mode == "own":
        assert task["state"] in ("failed", "cancelled"), task
    else:
        assert task["state"] == "pending", task
    if mode == "uvicorn":
        assert b"shutting down" in prof[1]


def test_report_file_survives_a_run_killed_by_sigkill(tmp_path):
    write(tmp_path / "server.py", SERVER)
    report = tmp_path / "report.txt"
    report.write_text("an earlier report\n")
    report.chmod(0o640)
    status, _, _ = run_until_ready(tmp_path, ["server.py", "default"], signal.SIGKILL,
                                   aioprof=["-o", str(report)])
    assert status == -signal.SIGKILL
    assert report.read_text() == "an earlier report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt", "server.py"]
    # A run that writes its report replaces the file whole, keeping its permissions.
    write(tmp_path / "quick.py", "print('ready', flush=True)\n")
    status, _, err = run_until_ready(tmp_path, ["quick.py"], None, aioprof=["-o", str(report)])
    assert status == 0 and err == b""
    assert report.read_text().startswith("aioprof: wall ")
    assert report.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quick.py", "report.txt", "server.py"]


# -- aioprof's own threads take no signal meant for the program ----------------------------
THREAD_MASKS = """\
    import asyncio, os, signal

    def blocked(tid):   # the signals a thread blocks, from the kernel's view of it
        with open(f"/proc/self/task/{tid}/status") as f:
            line = next(l for l in f if l.startswith("SigBlk:"))
        mask = int(line.split()[1], 16)
        return {s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP,
                            signal.SIGUSR1) if mask >> (s - 1) & 1}

    async def main():
        await asyncio.sleep(0.01)
        others = [int(t) for t in os.listdir("/proc/self/task") if int(t) != os.getpid()]
        print(len(others), all(len(blocked(t)) == 5 for t in others), len(blocked(os.getpid())))

    asyncio.run(main())
"""


@pytest.mark.parametrize("options", [[], ["--interval", "1"], ["--listen"]],
                         ids=["watchdog", "sampler", "listen"])
def test_aioprof_threads_block_the_programs_signals(tmp_path, options):
    """A signal sent to the process goes to a thread that does not block it, any of them:
    one that reached the watchdog, the sampler or the live server would run the program's
    Python handler late (the main thread's time.sleep or read is not interrupted), so each
    of aioprof's threads is born with the asynchronous signals blocked; the main thread's
    mask is the program's."""
    prog = write(tmp_path / "masks.py", THREAD_MASKS)
    proc = subprocess.run([sys.executable, "-m", "aioprof", "-o", str(tmp_path / "r.txt"),
                           *options, str(prog)], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    n, all_blocked, main_blocked = proc.stdout.split()
    assert int(n) >= 1 and all_blocked == "True" and main_blocked == "0", (proc.stdout, proc.stderr)
