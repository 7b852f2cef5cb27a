"""Run one program of tests/real/programs/ twice, without and under aioprof, and read back
aioprof's JSON report and the figures the program measured itself in the same run.

Each program serves a few requests (or runs a few jobs) whose handler awaits a known wait at
the line tagged `# [IDLE]`, blocks at `# [BLOCK]` (time.sleep), and creates a task at
`# [SPAWN]`. It measures each of those intervals with its own perf_counter and writes them
to the JSON file named by its first argument: {"sleep_s": S, "requests": [{"await_s",
"blocked_s", "roundtrip_s"}, ...]} in the order the requests ran. stdout holds only what
must be the same with and without aioprof (the responses).

The checks compare aioprof's figures with the program's own measurement of the same
interval, with slack only on the side a loaded machine cannot push (docs/testing.md):
  idle at [IDLE]: >= the wait the program asked for (a timer cannot fire early) less 15 ms
                  (idle starts when the suspending step ends, after the timer was set),
                  <= what the program measured around its await (which also holds the late
                  wake-up) plus 2 ms;
  busy:           the handler's task: >= the blocking the program measured less 1 ms, and
                  busy + idle at [IDLE] <= the client's round trip plus 20 ms (a task that
                  counted its wait as busy, or a busy step twice, cannot fit).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import pytest

from conftest import _import_root as import_root, importable

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
REPO = HERE.parents[1]

EARLY = 0.015   # idle starts when the suspending step ends, a little after the timer was set
AFTER = 0.002   # aioprof's idle may end this much after the program's own clock read
STEP_SLACK = 0.020  # steps of the handler's task that run after the client has its answer


def skip_or_fail(reason: str) -> None:
    """Skip, saying why; fail instead under `make test` and CI (AIOPROF_REQUIRE_REAL=1,
    set by tools/pytest.sh), where every program of the suite must run."""
    if os.environ.get("AIOPROF_REQUIRE_REAL"):
        pytest.fail(f"{reason} (AIOPROF_REQUIRE_REAL is set: tools/install-deps.sh installs it)",
                    pytrace=False)
    pytest.skip(reason)


def need(*modules: str) -> None:
    """Skip (saying which) when a package the program needs is not installed."""
    missing = [m for m in modules if not importable(m)]
    if missing:
        skip_or_fail(f"not installed for {sys.executable}: {', '.join(missing)} "
                     f"(tests/requirements.txt; make deps)")


def start_postgres() -> Tuple["subprocess.Popen[bytes]", str]:
    """Start Debian's PostgreSQL (initdb + postgres from /usr/lib/postgresql/*/bin) on a Unix
    socket in a new temporary directory that also holds its data directory; as root, as
    the user nobody. Returns (process, socket directory); skip_or_fail() when the
    binaries are missing."""
    import shutil
    import tempfile
    import time
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                  key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if not bins:
        skip_or_fail("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/postgres; "
                     "Debian package postgresql)")
    bindir = bins[-1].parent
    top = tempfile.mkdtemp(prefix="aioprof-pg-")
    as_user: List[str] = []
    if os.getuid() == 0:   # postgres refuses to run as root
        shutil.chown(top, "nobody")
        as_user = ["runuser", "-u", "nobody", "--"]
    data = os.path.join(top, "data")
    init = subprocess.run([*as_user, str(bindir / "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
                           "--no-sync", "-E", "UTF8"], capture_output=True, text=True, timeout=120)
    if init.returncode != 0:
        shutil.rmtree(top, ignore_errors=True)
        pytest.fail(f"initdb failed, exit {init.returncode}:\n{init.stdout}{init.stderr}")
    proc = subprocess.Popen([*as_user, str(bindir / "postgres"), "-D", data, "-k", top,
                             "-c", "listen_addresses=", "-c", "fsync=off"],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(top, "log"), "w"))
    deadline = time.monotonic() + 60
    while not postgres_ready(data, top):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log = Path(top, "log").read_text()
            shutil.rmtree(top, ignore_errors=True)
            pytest.fail(f"postgres did not start (exit {proc.poll()}):\n{log}")
        time.sleep(0.05)
    return proc, top


def postgres_ready(data: str, top: str) -> bool:
    """The server accepts connections: its socket exists and postmaster.pid's status line
    (the 8th) says "ready" (the socket appears before it accepts; a loaded machine can keep
    that gap long)."""
    try:
        lines = Path(data, "postmaster.pid").read_text().splitlines()
    except OSError:
        return False
    return (len(lines) > 7 and lines[7].strip() == "ready"
            and os.path.exists(os.path.join(top, ".s.PGSQL.5432")))


def stop_postgres(proc: "subprocess.Popen[bytes]", top: str) -> None:
    import shutil
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    shutil.rmtree(top, ignore_errors=True)


@dataclass
class Run:
    program: Path
    plain: "subprocess.CompletedProcess[str]"
    prof: "subprocess.CompletedProcess[str]"
    doc: dict
    measured: dict
    tags: Dict[str, int] = field(default_factory=dict)

    def is_program(self, filename: Optional[str]) -> bool:
        return bool(filename) and Path(filename).resolve() == self.program

    def line(self, tag: str) -> int:
        assert tag in self.tags, f"{self.program.name}: no line ends with '# [{tag}]'"
        return self.tags[tag]

    def user_tasks(self) -> List[dict]:
        return [t for t in self.doc["tasks"] if not t["internal"]]

    def through(self, tag: str) -> List[Tuple[dict, int, float]]:
        """(task, count, idle_s) of each task with suspensions whose await chain holds the
        [tag] line, in the order the tasks started."""
        line = self.line(tag)
        out = []
        for t in sorted(self.user_tasks(), key=lambda t: t["start_s"]):
            count, idle = 0, 0.0
            for a in t["await_sites"]:
                if any(self.is_program(c["file"]) and c["line"] == line for c in a["chain"]):
                    count += a["count"]
                    idle += a["idle_s"]
            if count:
                out.append((t, count, idle))
        return out

    def innermost_at(self, tag: str) -> List[dict]:
        """await_sites entries (over all tasks) whose await site in the program's own code
        (`user_site`: the innermost line outside libraries, docs/json.md) is the [tag] line."""
        line = self.line(tag)
        return [a for t in self.user_tasks() for a in t["await_sites"]
                if a["user_site"] and self.is_program(a["user_site"]["file"]) and a["user_site"]["line"] == line]

    def site(self, tag: str) -> dict:
        line = self.line(tag)
        found = [s for s in self.doc["sites"] if self.is_program(s["file"]) and s["line"] == line]
        assert len(found) == 1, f"expected one `sites` row for {self.program.name}:{line}, found {found}"
        return found[0]

    def created_at(self, tag: str) -> List[dict]:
        line = self.line(tag)
        return [t for t in self.user_tasks()
                if t["created_at"] and self.is_program(t["created_at"]["file"])
                and t["created_at"]["line"] == line]


def parse_tags(path: Path) -> Dict[str, int]:
    tags = {}
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = re.search(r"#\s*\[([A-Z][A-Z0-9_]*)\]\s*$", text)
        if m:
            tags[m.group(1)] = n
    return tags


def _env(extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(import_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("PYTHONSAFEPATH", None)
    env.update(extra or {})
    return env


def run_program(name: str, tmp: Path, *, aioprof_args: Sequence[str] = (),
                env: Optional[Mapping[str, str]] = None, timeout: float = 60) -> Run:
    """Run programs/<name> plainly, then under `python -m aioprof --format json`; fail the
    tests of the module (with the program's stderr) if either run failed."""
    program = (PROGRAMS / name).resolve()
    e = _env(env)
    plain = subprocess.run([sys.executable, str(program), str(tmp / "plain.json")], env=e,
                           cwd=str(tmp), capture_output=True, text=True, timeout=timeout)
    if plain.returncode != 0:
        pytest.fail(f"{name} failed without aioprof, exit {plain.returncode}:\n{plain.stderr}")
    report = tmp / "report.json"
    prof = subprocess.run([sys.executable, "-m", "aioprof", "--format", "json", "-o", str(report),
                           *aioprof_args, str(program), str(tmp / "measured.json")], env=e,
                          cwd=str(tmp), capture_output=True, text=True, timeout=timeout)
    if prof.returncode != 0 or not report.exists() or not (tmp / "measured.json").exists():
        pytest.fail(f"{name} failed under aioprof, exit {prof.returncode}:\n{prof.stderr}")
    doc = json.loads(report.read_text())
    measured = json.loads((tmp / "measured.json").read_text())
    return Run(program, plain, prof, doc, measured, parse_tags(program))


# ---------------------------------------------------------------- the shared checks

def check_same_as_plain(run: Run) -> None:
    assert run.prof.returncode == run.plain.returncode == 0
    assert run.prof.stdout == run.plain.stdout, (run.plain.stdout, run.prof.stdout)
    assert run.doc["warnings"] == [], run.doc["warnings"]
    assert run.doc["dropped_tasks"] == 0


def check_idle_at(run: Run, tag: str = "IDLE", per_request: Optional[int] = 1) -> None:
    """`per_request` suspensions (None: at least one) per request at [tag], in one task per
    request, idle in all between the wait asked for and the program's own measurement; the
    line's `sites` row adds them up."""
    reqs = run.measured["requests"]
    sleep = run.measured["sleep_s"]
    found = run.through(tag)
    counts = [c for _, c, _ in found]
    assert len(found) == len(reqs) and all(c == per_request if per_request else c >= 1 for c in counts), \
        f"{len(reqs)} requests, tasks through [{tag}]: {[(t['coroutine'], c) for t, c, _ in found]}"
    for (t, _, idle), m in zip(found, reqs):
        assert sleep - EARLY <= idle <= m["await_s"] + AFTER, \
            f"{t['coroutine']} idle at [{tag}] {idle:.4f} s; asked {sleep} s, measured {m['await_s']:.4f} s"
    s = run.site(tag)
    assert s["count"] == sum(counts), s
    assert len(reqs) * (sleep - EARLY) <= s["idle_s"] <= sum(m["await_s"] for m in reqs) + AFTER * len(reqs), s


def check_await_site(run: Run, tag: str = "IDLE") -> None:
    """The [tag] line is the await site (the innermost line) of those suspensions."""
    sites = run.innermost_at(tag)
    assert sum(a["count"] for a in sites) == sum(c for _, c, _ in run.through(tag)) > 0, \
        [(t["coroutine"], [(a["file"], a["line"]) for a in t["await_sites"]]) for t, _, _ in run.through(tag)]


def check_busy(run: Run, tag: str = "IDLE") -> None:
    """The handler's task is busy at least the time it blocked, and its busy + idle fit in
    the client's round trip."""
    found = run.through(tag)
    assert len(found) == len(run.measured["requests"]), [t["coroutine"] for t, _, _ in found]
    for (t, _, idle), m in zip(found, run.measured["requests"]):
        assert t["busy_s"] >= m["blocked_s"] - 0.001, (t["busy_s"], m)
        assert t["busy_s"] + idle <= m["roundtrip_s"] + STEP_SLACK, (t["busy_s"], idle, m)


def check_created_at(run: Run, tag: str, n: int) -> None:
    tasks = run.created_at(tag)
    assert len(tasks) == n, \
        f"tasks created at [{tag}]: {len(tasks)}; creation sites seen: " \
        f"{sorted({(t['coroutine'], (t['created_at'] or {}).get('file'), (t['created_at'] or {}).get('line')) for t in run.user_tasks()}, key=str)}"
