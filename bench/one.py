"""Run one benchmark workload once, under one profiler variant, in this process.

    python bench/one.py --workload switch --variant none [--report]

Prints one JSON line on stdout: {"workload", "variant", "seconds", "report_seconds"}.
"seconds" is time.perf_counter() around the workload's run() only: the profiler is
started before the clock starts and stopped after it stops. With --report the
profiler's stop and report writing (to memory or a temporary file, then discarded)
is timed separately as "report_seconds" (null otherwise).

On failure prints {"error": "..."} and exits 2. bench/run.py starts a fresh process
of this script per (workload, variant, repetition).
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import os
import sys
import tempfile
import time
import traceback
from typing import Callable, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import workloads  # noqa: E402

VARIANTS = ("none", "aioprof", "cprofile", "yappi", "pyinstrument", "viztracer",
            "aioprof-nosample", "aioprof-nowatch", "aioprof-sample", "aioprof-trace", "monitor")

# Ring-buffer size for viztracer: large enough that no workload here wraps it.
VIZTRACER_ENTRIES = 10_000_000

Hooks = Tuple[Callable[[], None], Callable[[], None], Callable[[], None]]


def _noop() -> None:
    pass


def make_variant(name: str) -> Hooks:
    """Return (start, stop, report) for profiler variant `name`.

    Imports and constructs the profiler here, outside the timed region.
    stop() ends measurement; report() writes the profiler's report and discards it.
    """
    if name == "none":
        return _noop, _noop, _noop

    if name == "aioprof":
        import aioprof

        p = aioprof.Profiler()

        def report() -> None:
            p.report(format="text", file=io.StringIO())

        # p.stop() also assembles the final document; it runs after the clock stops.
        return p.start, p.stop, report

    if name in ("aioprof-nosample", "aioprof-nowatch", "aioprof-sample", "aioprof-trace"):
        # aioprof without its sampler (interval 0), also without the watchdog thread
        # (AIOPROF_WATCHDOG=0), with a 1 ms sampler, and recording the trace (no sampler):
        # what sampling, the watchdog and trace recording cost.
        import aioprof

        if name == "aioprof-nowatch":
            os.environ["AIOPROF_WATCHDOG"] = "0"

        p = {"aioprof-nosample": lambda: aioprof.Profiler(interval_ms=0),
             "aioprof-nowatch": lambda: aioprof.Profiler(interval_ms=0),
             "aioprof-sample": lambda: aioprof.Profiler(interval_ms=1),
             "aioprof-trace": lambda: aioprof.Profiler(interval_ms=0, trace=True)}[name]()

        def report() -> None:
            p.report(format="text", file=io.StringIO())

        return p.start, p.stop, report

    if name == "monitor":
        # Loop instrumentation alone: a LoopMonitor on every loop the workload makes
        # (through the event loop policy, since each workload runs its own asyncio.run).
        import asyncio

        import aioprof

        monitors = []

        class Policy(asyncio.DefaultEventLoopPolicy):
            def new_event_loop(self):
                loop = super().new_event_loop()
                monitors.append(aioprof.LoopMonitor(loop))
                return loop

        def start() -> None:
            asyncio.set_event_loop_policy(Policy())

        def stop() -> None:
            for m in monitors:
                m.close()

        return start, stop, _noop

    if name == "cprofile":
        import cProfile
        import pstats

        prof = cProfile.Profile()

        def report() -> None:
            pstats.Stats(prof, stream=io.StringIO()).sort_stats("cumulative").print_stats(50)

        return prof.enable, prof.disable, report

    if name == "yappi":
        import yappi

        yappi.set_clock_type("wall")  # coroutine-aware wall time (yappi >= 1.2)

        def report() -> None:
            yappi.get_func_stats().print_all(out=io.StringIO())
            yappi.clear_stats()

        return yappi.start, yappi.stop, report

    if name == "pyinstrument":
        from pyinstrument import Profiler

        prof = Profiler(async_mode="enabled")

        def report() -> None:
            prof.output_text()

        return prof.start, prof.stop, report

    if name == "viztracer":
        from viztracer import VizTracer

        tracer = VizTracer(tracer_entries=VIZTRACER_ENTRIES, verbose=0)

        def report() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                tracer.save(os.path.join(tmp, "result.json"))
            tracer.clear()

        return tracer.start, tracer.stop, report

    raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--variant", required=True, choices=VARIANTS)
    ap.add_argument("--report", action="store_true",
                    help="also time the profiler's stop + report writing (report_seconds)")
    args = ap.parse_args(argv)
    out = {"workload": args.workload, "variant": args.variant}
    try:
        workloads.prepare(args.workload)
        run = workloads.WORKLOADS[args.workload]
        start, stop, report = make_variant(args.variant)
        gc.collect()
        start()
        t0 = time.perf_counter()
        try:
            run()
        finally:
            t1 = time.perf_counter()
            stop_t0 = time.perf_counter()
            stop()
        report_seconds = None
        if args.report:
            report()
            report_seconds = time.perf_counter() - stop_t0
        out.update(seconds=t1 - t0, report_seconds=report_seconds)
    except BaseException as exc:  # noqa: BLE001 - report any failure as data
        tb = traceback.format_exc(limit=8)
        out.update(error=f"{type(exc).__name__}: {exc}", traceback=tb)
        print(json.dumps(out), flush=True)
        return 2
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
