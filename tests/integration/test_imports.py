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
        import aioprof, aioprof.cli, aioprof.report, aioprof.metrics
        print("asyncio" in sys.modules, "aioprof._core" in sys.modules,
              "prometheus_client" in sys.modules)
        print("-- first use of LoopMonitor --", file=sys.stderr, flush=True)
        monitor = aioprof.LoopMonitor          # loaded on first use (it needs asyncio)
        print("asyncio" in sys.modules, monitor.__module__, "LoopMonitor" in dir(aioprof))
    """, flags=("-X", "importtime"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["False False False", "True aioprof.monitor True"]
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
        t_run = time.perf_counter()
        waited = loop.run_until_complete(main())
        ran = time.perf_counter() - t_run
        loop.close()
        real = type(uvloop.__loader__).__name__, type(uvloop.__spec__.loader).__name__
        print("loader:", *real)
    p.stop()
    print("after:", "uvloop" in sys.modules,
          [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("aioprof")])
    if sys.argv[1:] == ["use"]:
        (task,) = [t for t in p.stats()["tasks"] if t["coroutine"] == "main"]
        print("main:", task["steps"], task["idle_s"] + task["scheduled_s"], waited, ran)
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
    _, steps, waited_by_aioprof, waited, ran = lines[3].split()
    # Its task steps are seen: two steps around the one await. The task's idle plus
    # scheduled time is the await's wait plus the wait for its first step, so it lies
    # between (half) the wait the program measured around the await and the time it
    # measured around run_until_complete (on a busy machine the first step can be late).
    assert int(steps) == 2
    assert 0.5 * float(waited) <= float(waited_by_aioprof) <= float(ran) + 1e-3


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


# ------------------------------------------------------------------ free-threaded builds

# The slot ids of Py_mod_exec and Py_mod_gil (Include/moduleobject.h, 3.13+; 3.15 renumbered
# every slot, Include/slots_generated.h). Py_MOD_GIL_USED is NULL.
PY_MOD_EXEC, PY_MOD_GIL = (85, 87) if sys.version_info >= (3, 15) else (2, 4)


@pytest.mark.skipif(sys.version_info < (3, 13), reason="Py_mod_gil is new in 3.13")
def test_module_declares_it_needs_the_gil():
    """_core's module definition has the slot {Py_mod_gil, Py_MOD_GIL_USED}: a free-threaded
    interpreter turns the GIL on when it imports it (docs/interpreters.md). Read from the
    PyModuleDef itself (ctypes), as no Python API shows it on a build with a GIL."""
    import ctypes
    import sysconfig

    from aioprof import _core

    assert not sysconfig.get_config_var("Py_GIL_DISABLED"), "the layout below is a GIL build's"
    ptr = ctypes.c_void_p

    class Slot(ctypes.Structure):
        _fields_ = [("slot", ctypes.c_int), ("value", ptr)]

    head = ([("_ob_next", ptr), ("_ob_prev", ptr)] if sysconfig.get_config_var("Py_TRACE_REFS") else [])

    class ModuleDef(ctypes.Structure):   # PyModuleDef: PyModuleDef_HEAD_INIT, then its fields
        _fields_ = head + [("ob_refcnt", ctypes.c_ssize_t), ("ob_type", ptr), ("m_init", ptr),
                           ("m_index", ctypes.c_ssize_t), ("m_copy", ptr), ("m_name", ctypes.c_char_p),
                           ("m_doc", ctypes.c_char_p), ("m_size", ctypes.c_ssize_t),
                           ("m_methods", ptr), ("m_slots", ctypes.POINTER(Slot))]

    get_def = ctypes.pythonapi.PyModule_GetDef
    get_def.argtypes, get_def.restype = [ctypes.py_object], ctypes.POINTER(ModuleDef)
    mdef = get_def(_core).contents
    assert mdef.m_name == b"aioprof._core"   # the layout is right
    slots, i = {}, 0
    while mdef.m_slots[i].slot != 0:
        slots[mdef.m_slots[i].slot] = mdef.m_slots[i].value
        i += 1
    assert sorted(slots) == [PY_MOD_EXEC, PY_MOD_GIL], slots
    assert slots[PY_MOD_GIL] is None, slots   # None: a NULL void *, Py_MOD_GIL_USED


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
