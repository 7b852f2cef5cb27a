"""Benchmark aioprof against no profiler and peer profilers on asyncio workloads.

    python3 bench/run.py [--reps 5] [--workloads switch,echo] [--variants none,aioprof]
                         [--python PY] [--out FILE] [--json FILE] [--targets]
                         [--report-times]

Every (workload, variant, repetition) runs in a fresh subprocess,
``PY bench/one.py --workload W --variant V``, which times only the workload in-process
with time.perf_counter() (the profiler is started before and stopped after the timed
region; report writing is excluded, or timed separately with --report-times).

Runs are interleaved: for each workload, repetition 1 of every variant, then
repetition 2 of every variant, ... Every subprocess, the unprofiled one included, gets
``MALLOC_MMAP_THRESHOLD_=1048576 MALLOC_TRIM_THRESHOLD_=8388608`` (see
../shared/BENCH.md: asyncio's 256 KiB socket reads otherwise make the baseline depend on
glibc's dynamic mmap threshold) and ``PYTHONPATH=<repo>/src`` so that ``import aioprof``
finds the extension built in place by ``make build``.

The table has one row per workload and one column per variant: the median over
repetitions of (variant time / ``none`` time of the same repetition), and the ``none``
median in seconds. A peer that is not installed for the chosen interpreter is skipped
with a note; aioprof failing to import or to run gives "error" in its cells. The exit
status is 0 whatever the numbers: this is a benchmark, not a test.

Stdlib only.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ONE = os.path.join(HERE, "one.py")

sys.path.insert(0, HERE)
import workloads as _workloads  # noqa: E402

ALL_WORKLOADS = list(_workloads.WORKLOADS)  # switch, chain, echo, mixed, aiohttp
ALL_VARIANTS = ["none", "aioprof", "cprofile", "yappi", "pyinstrument", "viztracer",
                "aioprof-nosample", "aioprof-nowatch", "aioprof-sample", "aioprof-trace", "monitor"]
PEERS = ["cprofile", "yappi", "pyinstrument", "viztracer"]
LABELS = {"none": "none", "aioprof": "aioprof", "cprofile": "cProfile",
          "yappi": "yappi (wall)", "pyinstrument": "pyinstrument", "viztracer": "viztracer",
          "aioprof-nosample": "aioprof, no sampling",
          "aioprof-nowatch": "aioprof, no sampling, no watchdog", "aioprof-sample": "aioprof, 1 ms sampling",
          "aioprof-trace": "aioprof + trace",
          "monitor": "LoopMonitor only"}
# Module each variant needs (checked in the target interpreter before running).
VARIANT_MODULES = {"cprofile": "cProfile", "yappi": "yappi", "pyinstrument": "pyinstrument",
                   "viztracer": "viztracer"}
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "8388608"}
# Targets for --targets: aioprof's ratio to `none` on these workloads.
TARGETS = {"switch": 1.15, "echo": 1.05}
# What a feature adds, for --targets: (variant, against, workloads (None: all), limit) as
# the ratio of the two variants' median ratios to `none`.
ADDED_COST = [("aioprof-sample", "aioprof-nosample", None, 1.05),   # sampling at 1 ms
              ("aioprof-nosample", "aioprof-nowatch", None, 1.02),  # the watchdog (default)
              ("aioprof-trace", "aioprof-nosample", ["switch"], 1.25),
              ("monitor", "none", ["echo"], 1.03)]
AIOPROF_SMOKE = "import aioprof; aioprof.Profiler().start().stop()"


def csv_list(choices: List[str]):
    def parse(text: str) -> List[str]:
        items = [x.strip() for x in text.split(",") if x.strip()]
        bad = [x for x in items if x not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(bad)}; choose from {', '.join(choices)}")
        return items
    return parse


def child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.update(MALLOC_ENV)
    src = os.path.join(REPO, "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def probe(python: str, code: str, env: Dict[str, str]) -> Optional[str]:
    """Run `code` in `python`; None if it succeeds, else the last line of its stderr."""
    proc = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit status {proc.returncode}"


def run_one(python: str, workload: str, variant: str, env: Dict[str, str], timeout: float,
            report: bool) -> dict:
    cmd = [python, ONE, "--workload", workload, "--variant", variant]
    if report:
        cmd.append("--report")
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    result = None
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            result = json.loads(line)
            break
        except ValueError:
            continue
    if result is None:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        why = tail[-1] if tail else "no output"
        return {"error": f"exit status {proc.returncode}: {why}"}
    if proc.returncode != 0 and "error" not in result:
        result["error"] = f"exit status {proc.returncode}"
    if "error" in result and proc.stderr.strip():
        result["stderr"] = proc.stderr.strip()[-2000:]
    return result


def cpu_busy(window: float = 2.0) -> Optional[float]:
    """Fraction (0-1) of all CPUs' time spent busy over `window` seconds (/proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
        return sum(vals), idle
    try:
        t0, i0 = sample()
        time.sleep(window)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / (t1 - t0) if t1 > t0 else None


def wait_idle(max_wait: float, threshold: float = 0.15) -> Optional[float]:
    """Wait up to `max_wait` s for the machine to be < `threshold` busy; return last busy."""
    deadline = time.time() + max_wait
    busy = cpu_busy()
    while busy is not None and busy >= threshold and time.time() < deadline:
        time.sleep(3.0)
        busy = cpu_busy()
    return busy


def ratios(times: Dict[str, List[Optional[float]]], variant: str) -> List[float]:
    """Per-repetition ratios variant/none, over repetitions where both succeeded."""
    out = []
    for t, base in zip(times.get(variant, []), times.get("none", [])):
        if t is not None and base:
            out.append(t / base)
    return out


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}x"


def build_table(workloads: List[str], variants: List[str], cells: Dict[str, Dict[str, str]],
                none_median: Dict[str, Optional[float]]) -> str:
    cols = [v for v in variants if v != "none"]
    head = ["workload", "none (s)"] + [LABELS[v] for v in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in workloads:
        base = none_median.get(w)
        row = [w, f"{base:.3f}" if base is not None else cells[w].get("none", "error")]
        row += [cells[w].get(v, "-") for v in cols]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="Benchmark aioprof against no profiler and peer profilers.",
        epilog="Cells: median over repetitions of (variant time / `none` time of the same "
               "repetition); `none (s)` is the median unprofiled time in seconds.")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per cell (default 5)")
    ap.add_argument("--workloads", type=csv_list(ALL_WORKLOADS), default=ALL_WORKLOADS,
                    help=f"comma-separated subset of {','.join(ALL_WORKLOADS)}")
    ap.add_argument("--variants", type=csv_list(ALL_VARIANTS), default=ALL_VARIANTS,
                    help=f"comma-separated subset of {','.join(ALL_VARIANTS)} "
                         "(`none` is always run: it is the baseline)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the subprocesses (default: this one)")
    ap.add_argument("--out", help="write the markdown table (with command and versions) here")
    ap.add_argument("--json", dest="json_out", help="write every raw measurement here as JSON")
    ap.add_argument("--targets", action="store_true",
                    help="after the table, print PASS/FAIL for aioprof's targets")
    ap.add_argument("--report-times", action="store_true",
                    help="also time each profiler's stop + report writing (separate table)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds before one subprocess is killed (default 600)")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each round of variants, wait up to SECONDS for the machine's "
                         "CPUs to be < 15%% busy (other processes skew the numbers); default 0: "
                         "do not wait")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")

    command = shlex.join([os.path.basename(sys.executable) if sys.executable else "python3",
                          os.path.relpath(os.path.abspath(sys.argv[0]), REPO)] + sys.argv[1:]) \
        if argv is None else shlex.join(["bench/run.py"] + argv)
    env = child_env()
    # On SIGTERM, raise SystemExit: subprocess.run then kills the running child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    pyver = subprocess.run([args.python, "-c",
                            "import sys, platform; print(platform.python_implementation(), "
                            "sys.version.replace(chr(10), ' '))"],
                           capture_output=True, text=True, check=True).stdout.strip()

    variants = ["none"] + [v for v in args.variants if v != "none"]
    notes: List[str] = []
    cell_error: Dict[str, str] = {}  # variant -> error that applies to every workload
    for v in list(variants):
        mod = VARIANT_MODULES.get(v)
        if mod and probe(args.python, f"import {mod}", env) is not None:
            notes.append(f"{LABELS[v]}: not installed for {args.python}; skipped "
                         f"(pip install -r bench/requirements.txt)")
            variants.remove(v)
    if "aioprof" in variants:
        err = probe(args.python, AIOPROF_SMOKE, env)
        if err is not None:
            cell_error["aioprof"] = err
            notes.append(f"aioprof: `{AIOPROF_SMOKE}` failed: {err}")
    workloads = list(args.workloads)
    for w in list(workloads):
        for mod in _workloads.REQUIRES.get(w, []):
            if probe(args.python, f"import {mod}", env) is not None:
                notes.append(f"{w}: needs {mod}, not installed for {args.python}; skipped")
                workloads.remove(w)
                break

    times: Dict[str, Dict[str, List[Optional[float]]]] = {w: {v: [] for v in variants}
                                                          for w in workloads}
    report_times: Dict[str, Dict[str, List[float]]] = {w: {v: [] for v in variants}
                                                       for w in workloads}
    errors: Dict[str, Dict[str, str]] = {w: {} for w in workloads}
    raw: List[dict] = []
    started = time.time()
    load_before = os.getloadavg()
    busy_rounds = 0
    rounds = 0
    for w in workloads:
        for rep in range(args.reps):
            if args.wait_idle > 0:
                busy = wait_idle(args.wait_idle)
                rounds += 1
                if busy is not None and busy >= 0.15:
                    busy_rounds += 1
                    log(f"machine still {busy:.0%} busy after waiting {args.wait_idle:g} s; "
                        "running anyway")
            for v in variants:
                if v in cell_error:
                    errors[w][v] = cell_error[v]
                    times[w][v].append(None)
                    continue
                if v in errors[w]:  # failed before: do not retry on every repetition
                    times[w][v].append(None)
                    continue
                res = run_one(args.python, w, v, env, args.timeout, args.report_times)
                res.update(workload=w, variant=v, rep=rep)
                raw.append(res)
                if "error" in res:
                    errors[w][v] = res["error"]
                    times[w][v].append(None)
                    log(f"[{time.time() - started:6.0f}s] {w:8s} rep {rep + 1}/{args.reps} "
                        f"{v:13s} ERROR {res['error']}")
                    if res.get("traceback"):
                        log(res["traceback"].rstrip())
                    continue
                times[w][v].append(res["seconds"])
                if res.get("report_seconds") is not None:
                    report_times[w][v].append(res["report_seconds"])
                log(f"[{time.time() - started:6.0f}s] {w:8s} rep {rep + 1}/{args.reps} "
                    f"{v:13s} {res['seconds']:.3f} s")

    load_after = os.getloadavg()
    cells: Dict[str, Dict[str, str]] = {w: {} for w in workloads}
    ratio_median: Dict[str, Dict[str, Optional[float]]] = {w: {} for w in workloads}
    none_median: Dict[str, Optional[float]] = {}
    for w in workloads:
        base = [t for t in times[w]["none"] if t is not None]
        none_median[w] = statistics.median(base) if base else None
        if not base:
            cells[w]["none"] = "error"
        for v in variants:
            if v == "none":
                continue
            rs = ratios(times[w], v)
            if v in errors[w] and not rs:
                cells[w][v] = "error"
                ratio_median[w][v] = None
            elif not rs:
                cells[w][v] = "error" if not base else "-"
                ratio_median[w][v] = None
            else:
                m = statistics.median(rs)
                ratio_median[w][v] = m
                cells[w][v] = fmt_ratio(m) + ("*" if len(rs) < args.reps else "")

    table = build_table(workloads, variants, cells, none_median)
    # Noise only ever adds time, so the best (minimum) times are a second, contention-
    # robust view: min(variant) / min(none).
    min_cells: Dict[str, Dict[str, str]] = {w: {} for w in workloads}
    none_min: Dict[str, Optional[float]] = {}
    for w in workloads:
        base = [t for t in times[w]["none"] if t is not None]
        none_min[w] = min(base) if base else None
        for v in variants:
            ts = [t for t in times[w].get(v, []) if t is not None]
            if v != "none":
                min_cells[w][v] = (fmt_ratio(min(ts) / none_min[w]) if ts and none_min[w]
                                   else "error")
    min_table = build_table(workloads, variants, min_cells, none_min).replace(
        "| none (s) |", "| none best (s) |", 1)
    header = [
        f"Command: `{command}`",
        "",
        f"Python: {pyver} ({args.python}); {os.cpu_count()} CPUs; "
        f"reps: {args.reps}, interleaved; niceness {os.nice(0)}; env: "
        + " ".join(f"{k}={v}" for k, v in MALLOC_ENV.items())
        + f"; load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load_before)} before, "
        f"{'/'.join(f'{x:.2f}' for x in load_after)} after; "
        f"{time.time() - started:.0f} s in all"
        + (f"; {busy_rounds} of {rounds} rounds started on a busy machine (--wait-idle)"
           if args.wait_idle > 0 else "") + ".",
        "",
        "Cells: median over repetitions of (time under the profiler / unprofiled time of "
        "the same repetition); `none (s)`: median unprofiled time in seconds. Time is "
        "measured in-process around the workload only (report writing excluded).",
    ]
    if any("*" in c for row in cells.values() for c in row.values()):
        header.append("`*`: some repetitions failed; median of the ones that ran.")
    out_lines = header + ["", table, "",
                          "Best of the repetitions: min(time under the profiler) / "
                          "min(unprofiled time):", "", min_table]

    if args.report_times:
        rcols = [v for v in variants if v != "none"]
        rt = ["", "Report time (profiler stop + writing its report, discarded), median seconds:",
              "", "| workload | " + " | ".join(LABELS[v] for v in rcols) + " |",
              "|" + "---|" * (len(rcols) + 1)]
        for w in workloads:
            rt.append("| " + w + " | " + " | ".join(
                f"{statistics.median(report_times[w][v]):.3f}" if report_times[w][v] else
                ("error" if v in errors[w] else "-") for v in rcols) + " |")
        out_lines += rt

    err_lines = []
    for w in workloads:
        for v, e in errors[w].items():
            if v in cell_error:
                continue
            err_lines.append(f"- {w} / {LABELS[v]}: {e}")
    if notes or err_lines:
        out_lines += ["", "Notes:", ""] + [f"- {n}" for n in notes] + err_lines

    text = "\n".join(out_lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"command": command, "python": pyver, "reps": args.reps,
                       "env": MALLOC_ENV, "notes": notes, "runs": raw}, f, indent=1)

    if args.targets:
        print("Targets:")
        for w, limit in TARGETS.items():
            r = ratio_median.get(w, {}).get("aioprof") if w in workloads else None
            if "aioprof" not in variants or w not in workloads:
                print(f"  SKIP aioprof <= {limit:.2f}x on {w} (not run)")
            elif r is None:
                print(f"  FAIL aioprof <= {limit:.2f}x on {w}: error "
                      f"({errors[w].get('aioprof', 'no data')})")
            else:
                print(f"  {'PASS' if r <= limit else 'FAIL'} aioprof <= {limit:.2f}x on {w}: "
                      f"{r:.2f}x")
        for v, base, only, limit in ADDED_COST:
            for w in (only or workloads):
                a = ratio_median.get(w, {}).get(v) if w in workloads else None
                b = 1.0 if base == "none" else ratio_median.get(w, {}).get(base)
                what = f"{LABELS[v]} adds <= {100 * (limit - 1):.0f}% to {LABELS[base]} on {w}"
                if v not in variants or (base != "none" and base not in variants) or w not in workloads:
                    print(f"  SKIP {what} (not run)")
                elif a is None or b is None:
                    print(f"  FAIL {what}: error")
                else:
                    print(f"  {'PASS' if a / b <= limit else 'FAIL'} {what}: {a / b:.3f}")
        peers = [v for v in variants if v in PEERS]
        if "aioprof" not in variants or not peers:
            print("  SKIP aioprof below every peer on every workload (aioprof or peers not run)")
        else:
            for w in workloads:
                r = ratio_median[w].get("aioprof")
                pr = {p: ratio_median[w].get(p) for p in peers}
                best = min((x for x in pr.values() if x is not None), default=None)
                if r is None:
                    print(f"  FAIL aioprof below every peer on {w}: aioprof error")
                elif best is None:
                    print(f"  SKIP aioprof below every peer on {w}: no peer data")
                else:
                    worse = [f"{LABELS[p]} {x:.2f}x" for p, x in pr.items()
                             if x is not None and x <= r]
                    verdict = "PASS" if not worse else "FAIL"
                    detail = f"aioprof {r:.2f}x, best peer {best:.2f}x"
                    if worse:
                        detail += f"; not below {', '.join(worse)}"
                    print(f"  {verdict} aioprof below every peer on {w}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
