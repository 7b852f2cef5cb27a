"""Run one program of ../shared/cases under aioprof and read back its JSON report.

Each `test_caseNN_*.py` has one module-scoped fixture that calls `run_case()` once; its
tests then assert the values of the case's header on the `CaseRun` it returns.

How the program runs: `python -m aioprof --format json -o OUT case.py` when the CLI works
(`python -m aioprof --help` exits 0), else the Python API in a `python -c` one-liner
(`Profiler().start()`, `runpy.run_path`, `stop()`, `json.dump(stats())`; forced with
AIOPROF_CASES_RUNNER=api). Either way in a subprocess of `sys.executable` that imports the
same aioprof build as the test process.

A run on a machine too busy for the header's tolerances is repeated (up to `attempts`
runs): each case prints its own timings, measured with the program's own clock, and its
test module passes `noisy(run)`, which lists the printed values outside the header's
ranges, and, for cases that spin on the CPU, a process that got less CPU from the OS
(getrusage of the child) than its spins need. Only the program's own figures and the
OS's decide a retry, never aioprof's, so a retry cannot hide a wrong report; the
tolerances are the headers'. A run that stays noisy is tested anyway (with a warning).

Lines are found by the `# [TAG]` comments of the case file, and checked against the
`[TAG:Lnn]` references of its header (`tag_mismatches()`).

Vocabulary of the headers (../shared/cases/README.md) and what it is in the report:
  - "await time" at a line = idle while suspended there + the late wake-up (ready but not
    yet resumed). aioprof charges idle to the await chain (`await_sites[*].idle_s`,
    `sites[*].idle_s`); the late wake-up is only in the task's `scheduled_s`, which also
    holds the wait before the first step. So, for a task, the late wake-ups of all its
    suspensions are `scheduled_s - (first_step_s - start_s)` (`late_wakeup()`).
  - "load" = 1 - select wait / wall: `loops[*].utilization` (aioprof's `load` caps each
    select at its timeout, a different figure).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

try:
    import resource
except ImportError:   # not on Windows
    resource = None  # type: ignore[assignment]

REPO = Path(__file__).resolve().parents[2]

# The coroutines of the two tasks asyncio.run() adds at shutdown.
SHUTDOWN_COROUTINES = ("shutdown_asyncgens", "shutdown_default_executor")


# ---------------------------------------------------------------- running a case

def import_root() -> Path:
    """Where this process imports aioprof from (src/, or another build under a sanitizer)."""
    spec = importlib.util.find_spec("aioprof")
    if spec is None or not spec.submodule_search_locations:
        return REPO / "src"
    return Path(list(spec.submodule_search_locations)[0]).parent


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(import_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("PYTHONSAFEPATH", None)
    return env


@functools.lru_cache(maxsize=None)
def cli_works() -> bool:
    """True when `python -m aioprof --help` exits 0 and offers --format (the CLI is usable)."""
    try:
        p = subprocess.run([sys.executable, "-m", "aioprof", "--help"], env=_env(),
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "--format" in p.stdout and "--slow-ms" in p.stdout


# The fallback: the Python API in one `python -c`.
_API_RUNNER = (
    "import sys, runpy, json, aioprof\n"
    "case, out, slow_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
    "sys.argv = [case]\n"
    "p = aioprof.Profiler(slow_ms=slow_ms, interval_ms=1).start()\n"
    "try:\n"
    "    runpy.run_path(case, run_name='__main__')\n"
    "finally:\n"
    "    p.stop()\n"
    "    json.dump(p.stats(), open(out, 'w'))\n"
)


@dataclass
class CaseRun:
    """One run of a case program under aioprof, and lookups into its report."""

    path: Path                 # the case file (absolute)
    mode: str                  # "cli" or "api"
    returncode: int
    stdout: str
    stderr: str
    doc: Optional[dict]        # the JSON report, None if none was written
    tags: Dict[str, int] = field(default_factory=dict)         # TAG -> line of `# [TAG]`
    header_tags: Dict[str, int] = field(default_factory=dict)  # TAG -> nn of `[TAG:Lnn]`
    attempts: int = 1
    noise: List[List[str]] = field(default_factory=list)       # noisy(run) of runs retried
    child_cpu_s: Optional[float] = None   # user + system CPU of the subprocess (getrusage)

    # ---- source lines
    def line(self, tag: str) -> int:
        """The line number of the line ending with `# [tag]`."""
        assert tag in self.tags, f"{self.path.name}: no line ends with '# [{tag}]'"
        return self.tags[tag]

    def is_case_file(self, filename: Optional[str]) -> bool:
        if not filename:
            return False
        try:
            return Path(filename).resolve() == self.path
        except OSError:
            return False

    # ---- tasks
    @property
    def all_tasks(self) -> List[dict]:
        return list(self.doc["tasks"])

    def user_tasks(self) -> List[dict]:
        """Tasks that are not asyncio's own, in the order aioprof first saw them.

        The README's rule is `internal: true`. asyncio.run's two shutdown tasks are also
        left out by their coroutine (defined in asyncio's base_events.py), so that one
        mislabelled `internal` flag shows up once, in test_internal_tasks(), not as a wrong
        task count in every test of the case.
        """
        return [t for t in self.doc["tasks"] if not t["internal"] and not self._is_shutdown(t)]

    def internal_tasks(self) -> List[dict]:
        return [t for t in self.doc["tasks"] if t["internal"]]

    def shutdown_tasks(self) -> List[dict]:
        return [t for t in self.doc["tasks"] if self._is_shutdown(t)]

    @staticmethod
    def _is_shutdown(t: dict) -> bool:
        name = t["coroutine"].rsplit(".", 1)[-1]
        return name in SHUTDOWN_COROUTINES and Path(t["file"] or "").name == "base_events.py" \
            and Path(t["file"]).parent.name == "asyncio"

    def tasks_of(self, coroutine: str) -> List[dict]:
        return [t for t in self.user_tasks() if t["coroutine"] == coroutine]

    # ---- await sites of a task
    def awaits_through(self, task: dict, line: int) -> Tuple[int, float]:
        """(count, idle_s) of the task's suspensions whose await chain has `line` of the
        case file on it (as the await site itself or as an outer frame)."""
        count, idle = 0, 0.0
        for a in task["await_sites"]:
            if any(self.is_case_file(c["file"]) and c["line"] == line for c in a["chain"]):
                count += a["count"]
                idle += a["idle_s"]
        return count, idle

    def await_sites_at(self, task: dict, line: int) -> List[dict]:
        """The task's await_sites entries whose await site (innermost frame) is `line`."""
        return [a for a in task["await_sites"] if self.is_case_file(a["file"]) and a["line"] == line]

    @staticmethod
    def chain_lines(entry: dict) -> List[Tuple[str, int]]:
        return [(c["function"], c["line"]) for c in entry["chain"]]

    # ---- per-line, per-coroutine, per-callback rows
    def site(self, line: int) -> dict:
        found = [s for s in self.doc["sites"] if self.is_case_file(s["file"]) and s["line"] == line]
        assert len(found) == 1, f"expected one `sites` row for {self.path.name}:{line}, found {found}"
        return found[0]

    def has_site(self, line: int) -> bool:
        return any(self.is_case_file(s["file"]) and s["line"] == line for s in self.doc["sites"])

    def coroutine(self, qualname: str, *, case_file: bool = True) -> dict:
        found = [c for c in self.doc["coroutines"] if c["coroutine"] == qualname
                 and (not case_file or self.is_case_file(c["file"]))]
        assert len(found) == 1, f"expected one `coroutines` row for {qualname}, found {found}"
        return found[0]

    def callbacks_named(self, suffix: str) -> List[dict]:
        """`callbacks` rows whose qualname is `suffix` or ends with `.suffix`."""
        return [c for c in self.doc["callbacks"]
                if c["callback"] == suffix or c["callback"].endswith("." + suffix)]

    # ---- loops
    @property
    def loops(self) -> List[dict]:
        return list(self.doc["loops"])

    def the_loop(self) -> dict:
        assert len(self.doc["loops"]) == 1, f"expected one event loop, got {len(self.doc['loops'])}"
        return self.doc["loops"][0]

    def slow(self, loop: dict, kind: str) -> List[dict]:
        """The loop's slow_steps of one kind ("step", "callback", "tick"), by start time."""
        return sorted((s for s in loop["slow_steps"] if s["kind"] == kind), key=lambda s: s["at_s"])

    def is_site(self, site: Optional[dict], line: int) -> bool:
        return site is not None and self.is_case_file(site["file"]) and site["line"] == line

    # ---- sampled on-loop time (docs/stacks.md)
    def sampled_stacks(self) -> List[Tuple[List[dict], float]]:
        """(frames root first, time_s) of every sampled stack; fails if the report has no
        samples (the cases run with sampling on: --interval 1 ms)."""
        assert "samples" in self.doc and "frames" in self.doc, "no samples in the report"
        frames = self.doc["frames"]
        return [([frames[i] for i in st["stack"]], st["time_s"]) for st in self.doc["samples"]["stacks"]]

    def sampled_time(self, *path: Tuple[str, int]) -> float:
        """Sampled time of the stacks that run through the case file's frames `path`
        ((function, line), outer first, consecutive frames of one stack)."""
        total = 0.0
        for frames, time_s in self.sampled_stacks():
            code = [(f["function"], f["line"]) if f["kind"] == "code" and self.is_case_file(f["file"])
                    else None for f in frames]
            n = len(path)
            if any(tuple(code[i:i + n]) == tuple(path) for i in range(len(code) - n + 1)):
                total += time_s
        return total

    def sampled_under_task(self, coroutine: str, *path: Tuple[str, int]) -> float:
        """Like sampled_time(), but only stacks in which `path` runs inside a task of
        `coroutine` (the nearest task marker above the path is that coroutine's)."""
        total = 0.0
        for frames, time_s in self.sampled_stacks():
            for i in range(len(frames) - len(path) + 1):
                if all(frames[i + k]["kind"] == "code" and self.is_case_file(frames[i + k]["file"])
                       and (frames[i + k]["function"], frames[i + k]["line"]) == path[k]
                       for k in range(len(path))):
                    markers = [f for f in frames[:i] if f["kind"] == "task"]
                    if markers and markers[-1]["coroutine"] == coroutine:
                        total += time_s
                    break
        return total


def parse_tags(path: Path) -> Tuple[Dict[str, int], Dict[str, int]]:
    """(TAG -> line ending with `# [TAG]`, TAG -> nn of each `[TAG:Lnn]` in the header)."""
    tags: Dict[str, int] = {}
    header: Dict[str, int] = {}
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = re.search(r"#\s*\[([A-Z][A-Z0-9_]*)\]\s*$", text)
        if m and not text.lstrip().startswith("#"):
            assert m.group(1) not in tags, f"{path.name}: tag [{m.group(1)}] on two lines"
            tags[m.group(1)] = n
        if text.startswith("#"):
            for tag, nn in re.findall(r"\[([A-Z][A-Z0-9_]*):L(\d+)\]", text):
                header.setdefault(tag, int(nn))
    return tags, header


def tag_mismatches(run: CaseRun) -> List[str]:
    """Header references [TAG:Lnn] whose line does not end with `# [TAG]`, and the reverse."""
    out = []
    for tag, nn in run.header_tags.items():
        if run.tags.get(tag) != nn:
            out.append(f"[{tag}:L{nn}] but '# [{tag}]' is on line {run.tags.get(tag)}")
    for tag in run.tags:
        if tag not in run.header_tags:
            out.append(f"'# [{tag}]' on line {run.tags[tag]} is not in the header")
    return out


def case_file(cases_dir: Path, prefix: str) -> Path:
    found = sorted(cases_dir.glob(f"{prefix}_*.py"))
    if len(found) != 1:
        pytest.skip(f"case {prefix}_*.py not found (or not unique) in {cases_dir}")
    return found[0].resolve()


Noisy = Callable[["CaseRun"], List[str]]


def run_case(cases_dir: Path, prefix: str, out_dir: Path, *, slow_ms: float = 100.0,
             noisy: Optional[Noisy] = None, attempts: int = 5, timeout: float = 120.0) -> CaseRun:
    """Run the case `prefix`_*.py of `cases_dir` under aioprof; again (up to `attempts`
    runs in all) while `noisy(run)` finds the program's own timings out of range. Never
    raises on a failed run (the tests check returncode and doc)."""
    path = case_file(cases_dir, prefix)
    tags, header = parse_tags(path)
    noise: List[List[str]] = []
    for attempt in range(1, attempts + 1):
        run = _run_once(path, out_dir / f"report{attempt}.json", slow_ms, timeout)
        run.tags, run.header_tags, run.attempts, run.noise = tags, header, attempt, noise
        if run.returncode != 0 or run.doc is None or noisy is None:
            return run
        problems = noisy(run)
        if not problems:
            return run
        noise.append(problems)
    return run


def _run_once(path: Path, out: Path, slow_ms: float, timeout: float) -> CaseRun:
    # AIOPROF_CASES_RUNNER=api forces the Python-API runner (to test that path too).
    if os.environ.get("AIOPROF_CASES_RUNNER", "") != "api" and cli_works():
        mode = "cli"
        cmd = [sys.executable, "-m", "aioprof", "--format", "json", "-o", str(out),
               "--slow-ms", repr(slow_ms), "--interval", "1", str(path)]
    else:
        mode = "api"
        cmd = [sys.executable, "-c", _API_RUNNER, str(path), str(out), repr(slow_ms)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN) if resource else None
    p = subprocess.run(cmd, cwd=str(path.parent), env=_env(), capture_output=True, text=True,
                       timeout=timeout)
    child_cpu = None
    if before is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    doc = None
    if out.exists() and out.stat().st_size:
        with open(out, encoding="utf-8") as f:
            doc = json.load(f)
    return CaseRun(path=path, mode=mode, returncode=p.returncode, stdout=p.stdout, stderr=p.stderr,
                   doc=doc, child_cpu_s=child_cpu)


_EMPTY_PROGRAM = "import asyncio\nasync def main(): pass\nasyncio.run(main())\n"


@functools.lru_cache(maxsize=None)
def baseline_cpu() -> Optional[float]:
    """CPU time (getrusage) of running an empty asyncio program the way cases are run:
    interpreter start-up, imports, profiler, report. Measured once per session."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "empty.py"
        path.write_text(_EMPTY_PROGRAM, encoding="utf-8")
        runs = [_run_once(path, Path(d) / f"r{i}.json", 100.0, 60.0) for i in range(2)]
    cpus = [r.child_cpu_s for r in runs if r.returncode == 0 and r.child_cpu_s is not None]
    return min(cpus) if cpus else None


def starved(run: CaseRun, spin_cpu: float) -> List[str]:
    """For `noisy()` of a case that spins on time.perf_counter for `spin_cpu` seconds in
    all: the OS gave the process (less the start-up CPU of an empty program) less than 90%
    of that CPU, so the spins ran partly off CPU and the header's CPU figures cannot hold."""
    base = baseline_cpu()
    if run.child_cpu_s is None or base is None:
        return []
    net = run.child_cpu_s - base
    if net < 0.9 * spin_cpu:
        return [f"process CPU {net:.3f} s (beyond start-up) < 90% of {spin_cpu:g} s of spinning: CPU-starved"]
    return []


def run_or_fail(shared_cases: Path, case: str, tmp_path_factory: Any, **kw: Any) -> "CaseRun":
    """run_case() in a fresh temporary directory; fails the tests of the module (one line
    of why and the program's stderr) when the program failed or wrote no report."""
    r = run_case(shared_cases, case, tmp_path_factory.mktemp(f"case{case}"), **kw)
    if r.returncode != 0 or r.doc is None:
        pytest.fail(f"case {case} failed under aioprof ({r.mode}), exit {r.returncode}:\n{r.stderr}")
    return r


def printed(stdout: str, pattern: str, ranges: Sequence[Tuple[str, float, float]]) -> List[str]:
    """For `noisy()`: match `pattern` in the program's stdout; each group must be a number
    within the matching (name, lo, hi) of `ranges`. Returns the problems found."""
    m = re.search(pattern, stdout)
    if not m:
        return [f"no match for {pattern!r}"]
    out = []
    for (name, lo, hi), value in zip(ranges, m.groups()):
        v = float(value)
        if not lo <= v <= hi:
            out.append(f"{name} printed {v:g}, header range [{lo:g}, {hi:g}]")
    return out


def check_ran(run: CaseRun, stdout_pattern: str) -> None:
    """The program exited 0, printed what it prints without aioprof, and a report exists."""
    assert run.returncode == 0, f"{run.path.name} exited {run.returncode} ({run.mode}):\n{run.stderr}"
    assert re.fullmatch(stdout_pattern, run.stdout, flags=re.S), \
        f"{run.path.name} printed something unexpected:\n{run.stdout}"
    assert run.doc is not None, f"no report written ({run.mode}):\n{run.stderr}"
    assert run.doc["aioprof"] == 1
    assert run.doc["warnings"] == [], run.doc["warnings"]
    assert run.doc["dropped_tasks"] == 0
    if run.noise:
        import warnings
        warnings.warn(f"{run.path.name}: machine too busy for the header's timings, run "
                      f"{run.attempts} times; noise seen: {run.noise}")


# ---------------------------------------------------------------- comparing numbers

def tol_pct(expected: float, pct: float, at_least: float) -> float:
    """"+-pct or +-at_least, whichever is larger" as an absolute tolerance."""
    return max(abs(expected) * pct, at_least)


def near(actual: float, expected: float, tol: float, what: str) -> None:
    assert actual is not None, f"{what}: got None, expected {expected:.4f} +- {tol:.4f}"
    assert abs(actual - expected) <= tol, \
        f"{what}: expected {expected:.4f} +- {tol:.4f}, got {actual:.4f}"


def within(actual: float, lo: float, hi: float, what: str) -> None:
    assert actual is not None, f"{what}: got None, expected [{lo:.4f}, {hi:.4f}]"
    assert lo <= actual <= hi, f"{what}: expected in [{lo:.4f}, {hi:.4f}], got {actual:.4f}"


def late_wakeup(task: dict) -> float:
    """Time the task was ready but not running, after its first step: the late wake-ups
    of all its suspensions (see the module docstring)."""
    return task["scheduled_s"] - (task["first_step_s"] - task["start_s"])


def await_time(task: dict) -> float:
    """The header's "await time" of all the task's suspensions: idle + late wake-up."""
    return sum(a["idle_s"] for a in task["await_sites"]) + late_wakeup(task)


def first_step_delay(task: dict) -> float:
    return task["first_step_s"] - task["start_s"]


def cpu_share(run: CaseRun, spin_cpu: float) -> float:
    """The share (0..1) of the CPU its spins need that the OS gave the case's process in
    this run: its CPU (getrusage, less an empty program's start-up CPU) over `spin_cpu`
    seconds of spinning. 1.0 when unknown."""
    base = baseline_cpu()
    if run.child_cpu_s is None or base is None:
        return 1.0
    return max(0.0, min(1.0, (run.child_cpu_s - base) / spin_cpu))


def check_wall_cpu_split(run: CaseRun, task: dict, expected_busy: float, what: str,
                         spin_cpu: Optional[float] = None) -> None:
    """CPU of a step that burns with time.perf_counter (a wall-clock spin): on a loaded
    machine the thread gets less CPU than wall time, so only bound it: never more than
    its busy time (+ one 20 ms allowance), at least half the expected CPU; when the OS
    gave the process only a share of the CPU its spins need (cpu_share(), `spin_cpu` s in
    all), a quarter of the expected CPU times that share, less one 4 ms scheduler slice
    (a starved process's CPU falls unevenly on its steps)."""
    assert task["cpu_s"] <= task["busy_s"] + 0.02, \
        f"{what}: cpu_s {task['cpu_s']:.4f} > busy_s {task['busy_s']:.4f} + 0.02"
    share = cpu_share(run, spin_cpu) if spin_cpu else 1.0
    low = 0.5 * expected_busy if share >= 1.0 else 0.25 * expected_busy * share - 0.004
    assert task["cpu_s"] >= low, \
        (f"{what}: cpu_s {task['cpu_s']:.4f} < {low:.4f}, half of the expected {expected_busy:.4f} "
         f"times the CPU share {share:.2f} the OS gave the process (it got "
         f"{run.child_cpu_s and run.child_cpu_s - (baseline_cpu() or 0):.3f} s of CPU beyond "
         f"start-up in {run.doc['wall_s']:.3f} s)")


def skip_unless_on_cpu(run: CaseRun, spin_cpu: float) -> None:
    """Skip a check of sampled lines when the OS gave the process less than 75% of the CPU
    its spins need in this run: on 3.10-3.12 the sampler signals only a thread that is on a
    CPU (docs/stacks.md), so how the samples of a starved run fall on lines depends on the
    OS. Never decided by aioprof's figures."""
    share = cpu_share(run, spin_cpu)
    if share < 0.75:
        pytest.skip(f"the process got {share:.0%} of the CPU its spins need: sampled lines not checked")


def check_lifetimes(run: CaseRun) -> None:
    """busy + scheduled + idle == (end or wall) - start for every task (docs/json.md)."""
    for t in run.all_tasks:
        end = t["end_s"] if t["end_s"] is not None else run.doc["wall_s"]
        total = t["busy_s"] + t["scheduled_s"] + t["idle_s"]
        assert abs(total - (end - t["start_s"])) <= 1e-6, \
            f"task {t['id']} {t['name']}: busy+scheduled+idle={total:.9f} != lifetime {end - t['start_s']:.9f}"


def check_internal_tasks(run: CaseRun, runs: int = 1) -> None:
    """asyncio.run()'s two shutdown tasks (per asyncio.run call) are reported as internal,
    and nothing else is."""
    shutdown = run.shutdown_tasks()
    assert len(shutdown) == 2 * runs, [t["coroutine"] for t in shutdown]
    wrong = [(t["name"], t["coroutine"], t["internal"]) for t in shutdown if not t["internal"]]
    assert not wrong, f"asyncio.run's shutdown tasks not marked internal: {wrong}"
    extra = [t["coroutine"] for t in run.internal_tasks() if t not in shutdown]
    assert not extra, f"tasks marked internal that are not asyncio's own: {extra}"


def check_loop_consistent(loop: dict) -> None:
    """The loop's derived figures agree with its raw ones."""
    assert loop["select_calls"] >= 1 and loop["ticks"] >= 1
    assert abs(loop["busy_s"] - (loop["wall_s"] - loop["select_wait_s"])) <= 2e-6
    assert abs(loop["utilization"] - loop["busy_s"] / loop["wall_s"]) <= 1e-6
    assert loop["utilization"] - 1e-9 <= loop["load"] <= 1.0 + 1e-9
    assert 0 <= loop["lag_p50_s"] <= loop["lag_p90_s"] <= loop["lag_p99_s"] <= loop["lag_max_s"] * 1.13 + 1e-6


def ids(tasks: Sequence[dict]) -> List[int]:
    return [t["id"] for t in tasks]
