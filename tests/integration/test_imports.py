"""Nothing is imported on the program's behalf (docs/design.md, "What aioprof imports"):
`import aioprof` imports no asyncio, a running profiler never imports uvloop (it hooks
uvloop when the program imports it), and in a subinterpreter the core refuses to load
with one clear ImportError line. Each check runs in a fresh interpreter."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import _import_root, importable


def run_python(source: str, *argv: str, flags: tuple = ()) -> "subprocess.CompletedProcess[str]":
    """Run `python *flags -c source *argv` with this aioprof on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(_import_root())] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(source), *argv], env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_aioprof_imports_no_asyncio():
    proc = run_python("""\
        import sys
        import aioprof, aioprof.cli, aioprof.report
        print("asyncio" in sys.modules, "aioprof._core" in sys.modules)
        print("-- first use of LoopMonitor --", file=sys.stderr, flush=True)
        monitor = aioprof.LoopMonitor          # loaded on first use (it needs asyncio)
        print("asyncio" in sys.modules, monitor.__module__, "LoopMonitor" in dir(aioprof))
    """, flags=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False False", "True aioprof.monitor True"]
    # -X importtime lists every module imported before the first print: no asyncio.
    before = proc.stderr.split("-- first use of LoopMonitor --")[0]
    assert "| aioprof" in before and "asyncio" not in before


UVLOOP_LATER = """\
    import sys, time
    import aioprof
    p = aioprof.Profiler().start()
    print("during:", "uvloop" in sys.modules)
    if sys.argv[1:] == ["use"]:
        import uvloop, asyncio
        async def main():
            t0 = time.perf_counter()
            await asyncio.sleep(0.05)
            return time.perf_counter() - t0
        loop = uvloop.new_event_loop()
        waited = loop.run_until_complete(main())
        loop.close()
        real = type(uvloop.__loader__).__name__, type(uvloop.__spec__.loader).__name__
        print("loader:", *real)
    p.stop()
    print("after:", "uvloop" in sys.modules,
          [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("aioprof")])
    if sys.argv[1:] == ["use"]:
        (task,) = [t for t in p.stats()["tasks"] if t["coroutine"] == "main"]
        print("main:", task["steps"], task["idle_s"] + task["scheduled_s"], waited)
"""


# Found is not enough: Debian's uvloop is found on 3.15 but built for 3.14 only.
UVLOOP = importable("uvloop")


@pytest.mark.skipif(not UVLOOP, reason="needs uvloop that imports here")
def test_profiler_does_not_import_uvloop():
    proc = run_python(UVLOOP_LATER)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["during: False", "after: False []"]


@pytest.mark.skipif(not UVLOOP, reason="needs uvloop that imports here")
def test_uvloop_imported_after_start_is_hooked():
    proc = run_python(UVLOOP_LATER, "use")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == ["during: False", "loader: SourceFileLoader SourceFileLoader", "after: True []"]
    _, steps, waited_by_aioprof, waited = lines[3].split()
    # Its task steps are seen: two steps around the one await, whose wait (idle plus
    # scheduled) lies inside the interval the program measured around it.
    assert int(steps) == 2
    assert 0.5 * float(waited) <= float(waited_by_aioprof) <= float(waited) + 1e-3


IN_SUBINTERPRETER = """\
    import aioprof
    try:
        aioprof.Profiler().start()
    except ImportError as e:
        print("ImportError:", e, flush=True)
"""
SUBINTERPRETER = f"""\
    try:
        import _interpreters as interpreters        # 3.13
    except ImportError:
        import _xxsubinterpreters as interpreters   # 3.12
    interpreters.run_string(interpreters.create(), {textwrap.dedent(IN_SUBINTERPRETER)!r})
"""


@pytest.mark.skipif(sys.version_info < (3, 12), reason="subinterpreters with their own GIL: 3.12+")
def test_subinterpreter_refusal_says_why():
    proc = run_python(SUBINTERPRETER)
    # Only the output is checked: CPython 3.12.1 itself aborts at exit once it has refused
    # to load a multi-phase extension module (uvloop's too) in a subinterpreter.
    assert proc.stdout.splitlines() == [
        "ImportError: aioprof._core cannot be loaded in a subinterpreter: aioprof profiles "
        "the main interpreter only (docs/design.md)"]


ASYNCIO_LATER = """\
    import json, sys, time
    import aioprof
    with aioprof.Profiler(interval_ms=float(sys.argv[2]), trace=True, async_stacks=True) as p:
        print("during:", "asyncio" in sys.modules)
        if sys.argv[1] == "use":
            import asyncio
            async def main():
                t0 = time.perf_counter()
                await asyncio.sleep(0.05)
                return time.perf_counter() - t0
            waited = asyncio.run(main())
    print("after:", "asyncio" in sys.modules,
          [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("aioprof")])
    doc = p.stats()
    print("keys:", json.dumps(sorted(doc)), json.dumps(sorted(doc.get("samples", {}))))
    if sys.argv[1] == "use":
        (task,) = [t for t in doc["tasks"] if t["coroutine"] == "main"]
        print("main:", task["steps"], task["idle_s"] + task["scheduled_s"], waited)
    else:
        print("empty:", doc["tasks"], doc["loops"], doc["warnings"], 0 < doc["wall_s"] < 60)
"""


@pytest.mark.parametrize("interval_ms", ["0", "1"])
def test_profiler_does_not_import_asyncio(interval_ms):
    """start/stop and `with Profiler()` import no asyncio; the document the program gets
    has the same keys as one whose program ran a loop."""
    unused = run_python(ASYNCIO_LATER, "none", interval_ms)
    used = run_python(ASYNCIO_LATER, "use", interval_ms)
    assert unused.returncode == 0 and used.returncode == 0, unused.stderr + used.stderr
    assert unused.stderr == used.stderr == ""
    lines, used_lines = unused.stdout.splitlines(), used.stdout.splitlines()
    assert lines[:2] == ["during: False", "after: False []"]
    assert lines[3] == "empty: [] [] [] True"
    assert used_lines[:2] == ["during: False", "after: True []"]
    assert lines[2] == used_lines[2]          # the same keys, with or without a loop
    # Imported after start(), asyncio is hooked at once: the task's two steps around its
    # one await, whose wait lies inside what the program measured around it.
    _, steps, waited_by_aioprof, waited = used_lines[3].split()
    assert int(steps) == 2
    assert 0.5 * float(waited) <= float(waited_by_aioprof) <= float(waited) + 1e-3


def test_second_profiler_refused_while_one_waits_for_asyncio():
    proc = run_python("""\
        import sys, aioprof
        p = aioprof.Profiler().start()
        try:
            aioprof.Profiler().start()
        except RuntimeError as e:
            print("refused:", e)
        p.stop()
        aioprof.Profiler().start().stop()
        print("asyncio" in sys.modules)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "refused: an aioprof profiler is already running in this process", "False"]
