"""Run CPython's own test_asyncio with aioprof started in every process.

    python tests/suites/run_stdlib.py [--interval MS] [--plain] [-- REGRTEST ARGS]

`python -m test test_asyncio -j2 -w` runs with tests/suites/site on PYTHONPATH, whose
sitecustomize starts aioprof.Profiler in every process (the regrtest workers included)
and records at exit that it ran (see site/sitecustomize.py). --interval MS turns
sampling on (e.g. 1). The run passes when regrtest passes, every worker process ran
under aioprof (a record per process, at least one with tasks) and no record has an aioprof
warning.

When tests fail under aioprof, those tests run again without aioprof: a test that fails
there too is the interpreter's own failure (printed, not counted against aioprof); a test
that passes without aioprof and fails with it fails the run. --plain runs the whole suite
without aioprof only (the reference run). Exit status 0 on success, 1 on failure.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def suite_env(record_dir: Optional[str], interval_ms: float) -> dict:
    """The environment of a suite run: this aioprof on the path, and with `record_dir`,
    site/ too, whose sitecustomize starts aioprof in every process and records there."""
    env = dict(os.environ)
    env.pop("PYTHONSAFEPATH", None)
    path = [str(REPO / "src")] + [p for p in [env.get("PYTHONPATH")] if p]
    if record_dir is not None:
        path.insert(0, str(HERE / "site"))
        env["AIOPROF_SUITE_DIR"] = record_dir
        env["AIOPROF_SUITE_INTERVAL"] = repr(interval_ms)
    else:
        env.pop("AIOPROF_SUITE_DIR", None)
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def regrtest(tests: List[str], extra: List[str], record_dir: Optional[str],
             interval_ms: float) -> Tuple[int, str]:
    env = suite_env(record_dir, interval_ms)
    # -w: regrtest runs a failed test once more on its own (its timing tests can fail on a
    # loaded machine); the run passes if that rerun passes, and regrtest names the test.
    cmd = [sys.executable, "-m", "test", "-j2", "-w", *extra, *tests]
    print("run_stdlib:", "with aioprof" if record_dir is not None else "without aioprof",
          f"(sampling every {interval_ms:g} ms)" if record_dir is not None and interval_ms else "",
          " ".join(cmd[1:]), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    sys.stdout.flush()
    return p.returncode, p.stdout


def failed_tests(output: str) -> List[str]:
    """The tests regrtest lists as failed (or in error) in its summary."""
    names: List[str] = []
    for m in re.finditer(r"^(?:\d+|One) tests? (?:failed|altered the execution environment"
                         r"|crashed|had errors)[^:\n]*:\n((?:    .*\n?)+)", output, re.M):
        names += m.group(1).split()
    return sorted(set(names))


REGRTEST_WORKER = r"libregrtest.worker|--worker-args"


def check_records(record_dir: str, workers_re: Optional[str] = REGRTEST_WORKER) -> List[str]:
    """What is wrong with the sitecustomize records of a run: none written, none of a worker
    process (whose argv matches `workers_re`, unless None), no task profiled, a warning."""
    problems = []
    records = []
    for f in sorted(Path(record_dir).glob("*.json")):
        try:
            records.append(json.loads(f.read_text()))
        except ValueError as e:
            problems.append(f"{f.name}: unreadable record ({e})")
    workers = [r for r in records if workers_re and re.search(workers_re, " ".join(r["argv"]))]
    if not records or (workers_re and not workers):
        problems.append(f"no {'regrtest worker' if workers_re else 'process'} ran under aioprof "
                        f"({len(records)} records)")
    if not any(r["tasks"] for r in records):
        problems.append("no process profiled a task")
    for r in records:
        if r["warnings"]:
            problems.append(f"aioprof warnings in {r['argv']}: {r['warnings']}")
    print(f"{len(records)} processes ran under aioprof"
          + (f" ({len(workers)} regrtest workers)" if workers_re else "")
          + f", {sum(r['tasks'] for r in records)} tasks in all", flush=True)
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=0.0, metavar="MS",
                    help="sampling interval in ms (0: no sampling)")
    ap.add_argument("--plain", action="store_true", help="run without aioprof only")
    ap.add_argument("--tests", nargs="+", default=["test_asyncio"], metavar="TEST")
    ap.add_argument("regrtest_args", nargs="*", help="more arguments for `python -m test`")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    if args.plain:
        rc, _ = regrtest(args.tests, args.regrtest_args, None, 0)
        print(f"run_stdlib: without aioprof: exit {rc} in {time.monotonic() - t0:.0f} s")
        return 0 if rc == 0 else 1
    with tempfile.TemporaryDirectory(prefix="aioprof-suite-") as records:
        rc, out = regrtest(args.tests, args.regrtest_args, records, args.interval)
        problems = check_records(records)
    if rc != 0:
        failed = failed_tests(out)
        if not failed:
            problems.append(f"regrtest exited {rc} under aioprof without naming a failed test")
        else:
            prc, pout = regrtest(failed, args.regrtest_args, None, 0)
            own = set(failed_tests(pout)) if prc != 0 else set()
            problems += own_failures("run_stdlib", failed, own, "the interpreter's own")
    return verdict("run_stdlib", "", problems, t0)


def own_failures(tag: str, failed: List[str], own: set, whose: str) -> List[str]:
    """Print the tests of `failed` that fail without aioprof too (`own`); the problem of
    those that fail under aioprof only."""
    if own:
        print(f"{tag}: failing without aioprof too ({whose}): {' '.join(sorted(own))}")
    ours = [t for t in failed if t not in own]
    return [f"fail under aioprof only: {' '.join(ours)}"] if ours else []


def verdict(tag: str, name: str, problems: List[str], t0: float) -> int:
    """Print the problems and the closing line; the exit status."""
    for p in problems:
        print(f"{tag}: FAILED: {p}")
    print(f"{tag}: {name}{'FAILED' if problems else 'passed'} in {time.monotonic() - t0:.0f} s "
          f"(python {sys.version.split()[0]})", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
