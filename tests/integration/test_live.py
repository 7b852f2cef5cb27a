"""Live use (docs/live.md): `--listen` serves a running program's figures and
`python -m aioprof snapshot PID` reports them, without stopping it.

One program with known timings runs once under `python -m aioprof --listen` (the module
fixture). It runs two tasks (one blocks the loop with time.sleep, one awaits
asyncio.sleep), measuring each with its own perf_counter, then leaves a third task
suspended and pauses until the test writes a line on its stdin. While it is paused the
fixture does everything a client can do to it: snapshots through the command line in
each format, garbage, stalled, vanishing and too many clients, and (as root) tries to
reach it as another user. Then it lets the program finish, and the tests compare:

- the snapshot with the program's own figures up to the pause (bounds that hold on any
  machine: each interval aioprof measures lies inside or outside one the program
  measured with the same clock), and with the final report (finished tasks' figures are
  frozen: equal);
- the final report with the program's figures, so the clients changed nothing.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

pytestmark = [pytest.mark.timing]

N_BLOCK, BLOCK_MS, N_SLEEP, SLEEP_MS, AFTER_MS = 4, 30, 4, 40, 50

# Blocks the loop N_BLOCK times for BLOCK_MS ms (time.sleep), measuring each block.
BLOCKER = f"""
async def blocker():
    busy = 0.0
    for _ in range({N_BLOCK}):
        t = P(); time.sleep({BLOCK_MS} / 1e3); busy += P() - t
        await asyncio.sleep(0)
    return busy
"""

PROGRAM = f"""
import asyncio, json, os, signal, sys, time
signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # a client that vanishes must not kill us
P = time.perf_counter
{BLOCKER}
async def sleeper():
    waited = 0.0
    for _ in range({N_SLEEP}):
        t = P(); await asyncio.sleep({SLEEP_MS} / 1e3); waited += P() - t
    return waited

async def waiter(ev, marks):
    marks["before_await"] = P()
    await ev.wait()

async def after():
    t = P(); await asyncio.sleep({AFTER_MS} / 1e3); return P() - t

async def main():
    loop = asyncio.get_running_loop()
    t0 = P()
    busy, waited = await asyncio.gather(blocker(), sleeper())
    gather = P() - t0
    ev, marks = asyncio.Event(), {{}}
    w = asyncio.create_task(waiter(ev, marks))
    await asyncio.sleep(0)             # waiter's first step runs and suspends before this
    t_suspended = P()
    go = loop.create_future()
    loop.add_reader(0, lambda: go.done() or go.set_result(os.read(0, 100)))
    print(json.dumps({{"pid": os.getpid(), "busy": busy, "waited": waited, "gather": gather,
                      "since_suspended": P() - t_suspended}}), flush=True)
    await go
    t_go = P()
    loop.remove_reader(0)
    ev.set()
    await w
    t_done = P()
    after_waited = await asyncio.create_task(after())
    print(json.dumps({{"waiter_upper": t_go - marks["before_await"],
                      "waiter_done_upper": t_done - marks["before_await"], "after": after_waited}}), flush=True)

asyncio.run(main())
"""

# Run as another user: can it list the directory or connect to the socket?
PROBE = r"""
import json, os, socket, sys
out = {}
def attempt(name, f):
    try:
        f(); out[name] = "ok"
    except OSError as e:
        out[name] = __import__("errno").errorcode.get(e.errno, str(e.errno))
attempt("listdir", lambda: os.listdir(sys.argv[1]))
attempt("stat", lambda: os.stat(sys.argv[2]))
attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect(sys.argv[2]))
print(json.dumps(out))
"""
NOBODY = 65534


def _env(xdg: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_import_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    env["XDG_RUNTIME_DIR"] = xdg
    env.pop("AIOPROF_LISTEN", None)
    return env


def _import_root() -> Path:
    import aioprof

    return Path(aioprof.__file__).resolve().parent.parent


def _cli(args: List[str], env: Dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aioprof", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _raw(path: str, data: bytes, *, read: bool = True, timeout: float = 20.0) -> Any:
    """Send `data` on a new connection; the answer (parsed) if `read`, else None."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server stopped reading a request that was too long
        return _answer(s) if read else None
    finally:
        s.close()


def _answer(s: socket.socket) -> Any:
    """The answer line read from `s` to its end (parsed), None if there is none."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return json.loads(buf) if buf else None


def _hello(path: str) -> Any:
    return _raw(path, b'{"aioprof_live": 1, "op": "hello"}\n')


def _until_served(path: str, deadline_s: float = 20.0) -> Any:
    """A hello answered ok, polling until the server has a free slot (by a deadline)."""
    end = time.monotonic() + deadline_s
    while True:
        answer = _hello(path)
        if (answer or {}).get("ok") or time.monotonic() > end:
            return answer
        time.sleep(0.05)


def _resume(proc: subprocess.Popen) -> Any:
    """Let the paused program go on; (stdout, stderr) once it has ended."""
    try:
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    except OSError:
        pass
    return proc.communicate(timeout=120)


def _as_nobody(args: List[str], probe: str = PROBE) -> Any:
    """Run `probe` with `args` as uid/gid nobody (no groups); its printed JSON."""
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           "/usr/bin/python3", "-c", probe, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _can_switch_user() -> str:
    """Why the other-user tests cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "not root: cannot run a client as another uid"
    if not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK):
        return "setpriv or /usr/bin/python3 missing"
    return ""


@pytest.fixture(scope="module")
def xdg():
    # A runtime directory others can enter, so that only aioprof's own directory and
    # socket keep another user out.
    d = tempfile.mkdtemp(prefix="aioprof-xdg-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def live(xdg, tmp_path_factory) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("live")
    (tmp / "prog.py").write_text(PROGRAM)
    env = _env(xdg)
    final = tmp / "final.json"
    proc = subprocess.Popen([sys.executable, "-m", "aioprof", "--listen", "--format", "json", "--by", "stack",
                             "--interval", "0", "-o", str(final), "prog.py"],
                            cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    r: Dict[str, Any] = {"tmp": tmp}
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)   # a deadline, not a hang
        assert ready, "the program did not reach its pause within 120 s"
        r["first line"] = proc.stdout.readline().decode()
        r["paused"] = json.loads(r["first line"])
        pid = r["pid"] = r["paused"]["pid"]
        directory = r["dir"] = os.path.join(xdg, "aioprof")
        path = r["path"] = os.path.join(directory, f"{pid}.sock")
        r["dir_stat"], r["sock_stat"] = os.lstat(directory), os.lstat(path)
        # garbage, in every way a client can misbehave
        stalled = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
        for i, s in enumerate(stalled):
            s.connect(path)
            if i:
                s.sendall(b'{"aioprof_live": 1, "op": ')   # half a request, then silence
        r["garbage"] = {
            "not json": _raw(path, b"\x00\xff garbage\n"),
            "not an object": _raw(path, b"[1, 2]\n"),
            "version": _raw(path, b'{"aioprof_live": 99, "op": "snapshot"}\n'),
            "op": _raw(path, b'{"aioprof_live": 1, "op": "exec"}\n'),
            "huge": _raw(path, b"x" * (8 << 20)),
            "huge line": _raw(path, b'{"aioprof_live": 1, "op": "' + b"s" * 100000 + b'"}\n'),
        }
        _raw(path, b"", read=False)                                          # connect, close
        _raw(path, os.urandom(3000), read=False)                             # mid-message
        _raw(path, b'{"aioprof_live": 1, "op": "snapshot"}\n', read=False)   # gone before the answer
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)                # gone mid-answer
        s.connect(path)
        s.sendall(b'{"aioprof_live": 1, "op": "snapshot"}\n')
        r["first bytes"] = s.recv(10)
        s.close()
        # the command line, while two clients are still stalled
        r["json"] = _cli(["snapshot", str(pid), "--format", "json", "-o", str(tmp / "snap.json")], env)
        r["snap"] = json.loads((tmp / "snap.json").read_text()) if r["json"].returncode == 0 else None
        r["text"] = _cli(["snapshot", str(pid)], env)
        r["idle flame"] = _cli(["snapshot", str(pid), "--format", "collapsed", "--flame", "idle"], env)
        r["trace"] = _cli(["snapshot", str(pid), "--format", "trace"], env)
        for s in stalled:
            s.close()
        # more clients at once than are served
        from aioprof.live.server import MAX_CLIENTS

        flood = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(MAX_CLIENTS + 4)]
        for s in flood:
            s.connect(path)
        r["over the limit"] = _hello(path)
        for s in flood:
            s.close()
        r["hello after"] = _until_served(path)
        # another user
        r["nobody"] = None if _can_switch_user() else _as_nobody([directory, path])
        if r["nobody"] is not None:
            os.chmod(directory, 0o711)   # let others through the directory: the socket's 0600 still refuses
            try:
                r["nobody through 0711"] = _as_nobody([directory, path])
            finally:
                os.chmod(directory, 0o700)
        r["snapshot after"] = _raw(path, b'{"aioprof_live": 1, "op": "snapshot"}\n')
    finally:
        out, err = _resume(proc)
    r["rc"], r["stdout"], r["stderr"] = proc.returncode, r.get("first line", "") + out.decode(), err.decode()
    r["end"] = json.loads(r["stdout"].splitlines()[-1]) if r["rc"] == 0 else None
    r["final"] = json.loads(final.read_text()) if final.exists() else None
    r["socket left"] = os.path.exists(r.get("path", ""))
    return r


def _coro(doc: dict, name: str) -> dict:
    [c] = [c for c in doc["coroutines"] if c["coroutine"] == name and c["file"].endswith("prog.py")]
    return c


def _task(doc: dict, name: str) -> dict:
    [t] = [t for t in doc["tasks"] if t["coroutine"] == name and t["file"].endswith("prog.py")]
    return t


EPS = 1e-6   # float rounding of two readings of the same clock


def test_program_unaffected(live):
    assert live["rc"] == 0, live["stderr"]
    assert live["stderr"] == ""
    lines = live["stdout"].splitlines()
    assert len(lines) == 2 and json.loads(lines[0]) == live["paused"], lines
    assert not live["socket left"], "the socket is removed at exit"


def test_socket_and_directory_modes(live):
    d, s = live["dir_stat"], live["sock_stat"]
    assert stat.S_ISDIR(d.st_mode) and stat.S_IMODE(d.st_mode) == 0o700 and d.st_uid == os.geteuid()
    assert stat.S_ISSOCK(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o600 and s.st_uid == os.geteuid()
    assert os.path.basename(live["path"]) == f"{live['pid']}.sock"
    assert [n for n in os.listdir(live["dir"]) if n.startswith(f"{live['pid']}") or ".tmp" in n] == []


def test_snapshot_json_matches_the_program(live):
    assert live["json"].returncode == 0 and live["json"].stderr == "", live["json"].stderr
    snap, p = live["snap"], live["paused"]
    blocker, sleeper = _coro(snap, "blocker"), _coro(snap, "sleeper")
    # every step of blocker holds one of its time.sleep()s; all of them lie in the gather
    assert blocker["steps"] == N_BLOCK + 1
    assert p["busy"] - EPS <= blocker["busy_s"] <= p["gather"] + EPS, (blocker, p)
    assert blocker["max_step_s"] >= BLOCK_MS / 1e3 - EPS
    # sleeper's idle is inside the awaits the program timed, and a timer never fires early
    assert sleeper["steps"] == N_SLEEP + 1
    assert N_SLEEP * (SLEEP_MS - 1) / 1e3 <= sleeper["idle_s"] <= p["waited"] + EPS, (sleeper, p)
    assert sleeper["idle_s"] + sleeper["scheduled_s"] <= p["gather"] + EPS
    # the waiter is suspended at the snapshot: its idle so far runs from before the
    # program's mark after its first step to after the pause was printed
    waiter = _task(snap, "waiter")
    assert waiter["state"] == "pending" and waiter["steps"] == 1, waiter
    assert p["since_suspended"] - EPS <= waiter["idle_s"], (waiter, p)
    assert waiter["idle_s"] <= live["end"]["waiter_upper"] + EPS, (waiter, live["end"])
    assert snap["wall_s"] <= live["final"]["wall_s"]


def test_snapshot_leaves_the_final_report_whole(live):
    snap, final = live["snap"], live["final"]
    assert final is not None and final["warnings"] == [], final and final["warnings"]
    for name in ("blocker", "sleeper"):   # finished before the snapshot: frozen since
        a, b = dict(_coro(snap, name)), dict(_coro(final, name))
        a.pop("cpu_s"), b.pop("cpu_s")    # CPU time is shared out when its window closes
        assert a == b, (a, b)
    waiter = _task(final, "waiter")
    assert waiter["state"] == "done" and waiter["steps"] == 2
    assert waiter["idle_s"] >= _task(snap, "waiter")["idle_s"]
    assert waiter["idle_s"] <= live["end"]["waiter_done_upper"] + EPS
    after = _coro(final, "after")     # profiling went on after the clients
    assert (after["tasks"], after["steps"]) == (1, 2)
    assert (AFTER_MS - 1) / 1e3 <= after["idle_s"] <= live["end"]["after"] + EPS, after


def test_snapshot_text_and_flame(live):
    text = live["text"]
    assert text.returncode == 0 and text.stderr == "", text.stderr
    assert text.stdout.startswith("aioprof: wall ")
    rows: Dict[str, List[str]] = {}
    for line in text.stdout.splitlines():   # the first line of each: its row of the table
        if line.split()[:1] in (["blocker"], ["sleeper"]):
            rows.setdefault(line.split()[0], line.split())
    assert rows["blocker"][1:3] == ["1", str(N_BLOCK + 1)], rows
    assert rows["sleeper"][1:3] == ["1", str(N_SLEEP + 1)], rows
    flame = live["idle flame"]
    assert flame.returncode == 0 and flame.stderr == "", flame.stderr
    idle = {}
    for line in flame.stdout.splitlines():
        stack, value = line.rsplit(" ", 1)
        if "sleeper (prog.py" in stack.split(";")[-1]:
            idle[stack] = int(value)
    assert N_SLEEP * (SLEEP_MS - 1) * 1000 <= sum(idle.values()) <= live["paused"]["waited"] * 1e6 + 1, idle


def test_snapshot_of_a_missing_part_is_one_line(live):
    t = live["trace"]
    assert t.returncode == 1 and t.stdout == ""
    assert t.stderr.count("\n") == 1 and "no trace" in t.stderr, t.stderr


def test_garbage_clients_get_errors(live):
    g = live["garbage"]
    for key in g:
        assert g[key]["ok"] is False and g[key]["aioprof_live"] == 1, (key, g[key])
    assert "not a line of JSON" in g["not json"]["error"]
    assert "not a JSON object" in g["not an object"]["error"]
    assert "version 99" in g["version"]["error"]
    assert "unknown op 'exec'" in g["op"]["error"]
    assert "longer than 4096 bytes" in g["huge"]["error"] and "longer" in g["huge line"]["error"]
    assert live["first bytes"] and b'{"aioprof_live"'.startswith(live["first bytes"]), live["first bytes"]


def test_too_many_clients_then_served_again(live):
    assert live["over the limit"]["ok"] is False and "try again" in live["over the limit"]["error"]
    hello = live["hello after"]
    assert hello["ok"] and hello["pid"] == live["pid"], hello
    after = live["snapshot after"]
    assert after["ok"] and _coro(after["doc"], "blocker") == _coro(live["snap"], "blocker")


def test_another_user_cannot_reach_it(live):
    why = _can_switch_user()
    if why:
        pytest.skip(why)
    assert live["nobody"] == {"listdir": "EACCES", "stat": "EACCES", "connect": "EACCES"}
    # with the directory opened for search, the socket's own mode still refuses
    assert live["nobody through 0711"]["connect"] == "EACCES", live["nobody through 0711"]


# ---------------------------------------------------------------- without a program

def test_snapshot_errors_are_one_line(xdg):
    env = _env(xdg)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    for args, status, words in ((["snapshot", dead], 1, f"no process with PID {dead}"),
                                (["snapshot", str(os.getpid())], 1, "is not listening"),
                                (["snapshot", "12x"], 2, "PID must be a positive integer"),
                                (["snapshot"], 2, "required")):
        p = _cli(args, env)
        assert p.returncode == status and p.stdout == "", (args, p)
        assert p.stderr.startswith("aioprof: error: ") and p.stderr.count("\n") == 1, (args, p.stderr)
        assert words in p.stderr, (args, p.stderr)


def test_listen_refuses_unsafe_directory_and_address(tmp_path, xdg):
    base = tempfile.mkdtemp(prefix="aioprof-xdg-", dir="/tmp")
    try:
        os.chmod(base, 0o755)
        os.mkdir(os.path.join(base, "aioprof"), 0o755)
        os.chmod(os.path.join(base, "aioprof"), 0o755)
        env = _env(base)
        p = _cli(["--listen", "-c", "print('ran')"], env)
        assert p.returncode == 2 and p.stdout == "", p
        assert p.stderr.count("\n") == 1 and "mode is 0755" in p.stderr and "must be 0700" in p.stderr, p.stderr
        p = _cli(["snapshot", str(os.getpid())], env)   # a client does not trust it either
        assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1, p
        assert "mode is 0755" in p.stderr, p.stderr
        if os.geteuid() == 0:
            os.chmod(os.path.join(base, "aioprof"), 0o700)
            os.chown(os.path.join(base, "aioprof"), NOBODY, NOBODY)
            p = _cli(["--listen", "-c", "print('ran')"], env)
            assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p
            assert f"owned by uid {NOBODY}" in p.stderr, p.stderr
        for address in ("0.0.0.0:8765", "192.0.2.1:80", "[::]:80"):   # not loopback
            p = _cli(["--listen", address, "-c", "print('ran')"], env)
            assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p
            assert f"--listen={address}: only a loopback address" in p.stderr, p.stderr
        # --listen takes no value otherwise: the script after it runs
        (tmp_path / "app.py").write_text("print('ran', flush=True)\n")
        p = _cli(["--listen", "-o", os.devnull, str(tmp_path / "app.py")], _env(xdg))
        assert p.returncode == 0 and p.stdout == "ran\n", p
    finally:
        shutil.rmtree(base, ignore_errors=True)


# The Python API: Profiler(listen=True), AIOPROF_LISTEN=1, a fork, and the arguments.
API_PROGRAM = r"""
import json, os, signal, socket, sys, time, warnings
import aioprof
from aioprof.live import client
out = {}
def served():
    try:
        return client.request(os.getpid(), "hello", timeout=20)["pid"] == os.getpid()
    except client.SnapshotError as e:
        return str(e)
sock = os.path.join(os.environ["XDG_RUNTIME_DIR"], "aioprof", f"{os.getpid()}.sock")

def sigterm_blocked(tid):
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("SigBlk:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except OSError:   # a thread that has ended since
        pass
    return False

before = set(os.listdir("/proc/self/task"))
p = aioprof.Profiler(listen=True).start()
out["listen=True"] = served()
stalled = socket.socket(socket.AF_UNIX)   # its thread waits for a request meanwhile
stalled.connect(sock)
def blocking():   # of the threads started since: the accepting one and the connection's
    return sum(map(sigterm_blocked, set(os.listdir("/proc/self/task")) - before))

end = time.monotonic() + 20   # (by a deadline: the connection's thread starts when it can)
while blocking() < 2 and time.monotonic() < end:
    time.sleep(0.01)
out["threads blocking SIGTERM"] = blocking()   # a signal sent to the process is not theirs
stalled.close()
with warnings.catch_warnings():   # 3.12+: "multi-threaded, use of fork()" (docs/live.md)
    warnings.simplefilter("ignore", DeprecationWarning)
    child = os.fork()
if child == 0:          # a forked child's exit leaves its parent's socket alone
    p.stop()
    os._exit(0)
os.waitpid(child, 0)
out["after the child's exit"] = served()
p.stop()
out["after stop"] = os.path.exists(sock)

os.environ["AIOPROF_LISTEN"] = "1"
p = aioprof.Profiler().start()
out["AIOPROF_LISTEN=1"] = served()
p.stop()
p = aioprof.Profiler(listen=False).start()
out["listen=False"] = os.path.exists(sock)
p.stop()
os.environ["AIOPROF_LISTEN"] = "10.0.0.1:8765"
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    p = aioprof.Profiler().start()
    out["AIOPROF_LISTEN=10.0.0.1:8765"] = [os.path.exists(sock), [str(x.message) for x in w]]
    p.stop()
del os.environ["AIOPROF_LISTEN"]
p = aioprof.Profiler(listen=True).start()
# A program that closes every descriptor and opens others: the number of the server's
# socket now names a file that is not a socket (the socket's release wakes its poll).
number = p._server.sock.fileno()
os.dup2(os.open(os.devnull, os.O_RDONLY), number)
t = time.process_time(); time.sleep(0.5)
out["cpu while closed"] = time.process_time() - t
p.stop()
try:                          # stop() closed its own descriptors, not the program's file
    out["the program's file is open"] = os.path.samestat(os.fstat(number), os.stat(os.devnull))
except OSError as e:
    out["the program's file is open"] = str(e)
for value in ("10.0.0.1:8765", "127.0.0.1:99999", "yes", 1):
    try:
        aioprof.Profiler(listen=value)
        out[repr(value)] = "accepted"
    except ValueError as e:
        out[repr(value)] = str(e)
print(json.dumps(out))
"""


def test_profiler_listen_api(xdg):
    p = subprocess.run([sys.executable, "-c", API_PROGRAM], env=_env(xdg), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    out = json.loads(p.stdout)
    assert out["listen=True"] is True and out["after the child's exit"] is True, out
    assert out["threads blocking SIGTERM"] >= 2, out
    assert out["after stop"] is False
    assert out["AIOPROF_LISTEN=1"] is True and out["listen=False"] is False, out
    exists, warned = out["AIOPROF_LISTEN=10.0.0.1:8765"]
    assert not exists and len(warned) == 1 and "only a loopback address" in warned[0], out
    assert "only a loopback address" in out["'10.0.0.1:8765'"], out
    assert "port must be an integer from 0 to 65535" in out["'127.0.0.1:99999'"], out
    assert out["cpu while closed"] < 0.1, out   # the server stopped; it does not spin on it
    assert out["the program's file is open"] is True, out
    assert out["'yes'"].startswith("listen must be") and out["1"].startswith("listen must be"), out


def test_answer_encoded_in_pieces_is_the_same_json():
    from aioprof.live import protocol

    doc = {"aioprof_live": 1, "ok": True, "doc": {
        "tasks": [{"id": i, "name": f"t\u00e9\n{i}", "await_sites": [{"line": i, "chain": [1, 2]}],
                   "busy_s": i / 7} for i in range(5)],
        "loops": [], "warnings": ["a \"quoted\" line"], "wall_s": 1.5, "dropped_tasks": 0,
        "nested": {"x": {"y": [None, True, {"z": []}]}}, "empty": {}}}
    assert protocol.encode_in_pieces(doc) == protocol.encode(doc)
    assert json.loads(protocol.encode_in_pieces(doc)) == doc


# TCP: --listen 127.0.0.1:0, a token on every request.
TCP_PROGRAM = f"""
import asyncio, json, os, time
P = time.perf_counter
{BLOCKER}
async def main():
    loop = asyncio.get_running_loop()
    t0 = P()
    busy = await asyncio.create_task(blocker())
    lifetime = P() - t0
    go = loop.create_future()
    loop.add_reader(0, lambda: go.done() or go.set_result(os.read(0, 100)))
    print(json.dumps({{"pid": os.getpid(), "busy": busy, "lifetime": lifetime}}), flush=True)
    await go
    loop.remove_reader(0)

asyncio.run(main())
"""

TCP_PROBE = r"""
import json, socket, sys
out = {}
try:
    open(sys.argv[1]).read(); out["read"] = "ok"
except OSError as e:
    out["read"] = __import__("errno").errorcode.get(e.errno, str(e.errno))
s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=20)
s.sendall(b'{"aioprof_live": 1, "op": "snapshot"}\n')
out["answer"] = json.loads(s.makefile("rb").readline())
print(json.dumps(out))
"""


def _readline(stream, what: str) -> str:
    ready, _, _ = select.select([stream], [], [], 120)
    assert ready, f"no {what} within 120 s"
    return stream.readline().decode()


def _tcp(port: int, request: bytes) -> Any:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(request)
        return _answer(s)


def test_tcp_listen_needs_the_token(xdg, tmp_path):
    (tmp_path / "prog.py").write_text(TCP_PROGRAM)
    env = _env(xdg)
    final = tmp_path / "final.json"
    proc = subprocess.Popen([sys.executable, "-m", "aioprof", "--listen", "127.0.0.1:0", "--format", "json",
                             "-o", str(final), "prog.py"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        announced = _readline(proc.stderr, "announcement on stderr")
        paused = json.loads(_readline(proc.stdout, "pause"))
        pid = paused["pid"]
        token_file = os.path.join(xdg, "aioprof", f"{pid}.tcp")
        st = os.lstat(token_file)
        info = json.loads(Path(token_file).read_text())
        port, token = info["port"], info["token"]
        no_token = _tcp(port, b'{"aioprof_live": 1, "op": "hello"}\n')
        wrong = _tcp(port, json.dumps({"aioprof_live": 1, "op": "hello", "token": token[:-1] + "x"}).encode() + b"\n")
        hello = _tcp(port, json.dumps({"aioprof_live": 1, "op": "hello", "token": token}).encode() + b"\n")
        by_pid = _cli(["snapshot", str(pid), "--format", "json"], env)
        address = f"127.0.0.1:{port}"
        without = _cli(["snapshot", address], env)
        with_token = _cli(["snapshot", address, "--format", "json"], dict(env, AIOPROF_TOKEN=token))
        nobody = None
        if not _can_switch_user():
            nobody = _as_nobody([token_file, str(port)], TCP_PROBE)
    finally:
        out, err = _resume(proc)
    assert proc.returncode == 0, err
    # the owner is told the port and the token, once, on stderr; nothing else is added
    assert announced == (f"aioprof: listening on 127.0.0.1:{port} (pid {pid}); every request must carry "
                         f"the token {token} (also in {token_file}, mode 0600)\n")
    assert err == b"" and out == b"", (out, err)
    assert len(token) == 64 and int(token, 16) >= 0
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert (info["pid"], info["host"]) == (pid, "127.0.0.1")
    assert not os.path.exists(token_file), "the token file is removed at exit"
    for answer in (no_token, wrong):
        assert answer["ok"] is False and "token" in answer["error"] and "doc" not in answer, answer
    assert hello["ok"] and hello["pid"] == pid
    for p in (by_pid, with_token):
        assert p.returncode == 0 and p.stderr == "", p.stderr
        blocker = _coro(json.loads(p.stdout), "blocker")
        assert blocker["steps"] == N_BLOCK + 1
        assert paused["busy"] - EPS <= blocker["busy_s"] <= paused["lifetime"] + EPS, (blocker, paused)
    assert without.returncode == 2 and without.stderr.count("\n") == 1 and "AIOPROF_TOKEN" in without.stderr
    final_blocker = _coro(json.loads(final.read_text()), "blocker")
    assert final_blocker["busy_s"] == _coro(json.loads(by_pid.stdout), "blocker")["busy_s"]
    if nobody is not None:   # another user can connect to the port, but gets nothing without the token
        assert nobody["read"] == "EACCES", nobody
        assert nobody["answer"]["ok"] is False and "token" in nobody["answer"]["error"], nobody


def test_sigterm_removes_the_socket(xdg, tmp_path):
    # (an asyncio program: on 3.14 a SIGTERM may miss a time.sleep() of the main thread
    # while the core's watchdog thread runs, with or without listening; see the report)
    code = "import asyncio, os; print(os.getpid(), flush=True); asyncio.run(asyncio.sleep(120))"
    proc = subprocess.Popen([sys.executable, "-m", "aioprof", "--listen", "--format", "json", "-o",
                             str(tmp_path / "out.json"), "-c", code], env=_env(xdg),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pid = int(_readline(proc.stdout, "pid"))
        path = os.path.join(xdg, "aioprof", f"{pid}.sock")
        hello = _until_served(path)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    assert hello["ok"] and hello["pid"] == pid, hello
    assert proc.returncode == -15 and err == b"", err    # SIGTERM's death, as without aioprof
    assert json.loads((tmp_path / "out.json").read_text())["aioprof"] == 1
    assert not os.path.exists(path)
