"""Start aioprof in every Python process of a suite run (tests/suites/run_stdlib.py).

On PYTHONPATH only for those runs, and active only when AIOPROF_SUITE_DIR is set: the
profiler starts before the program runs, and at exit each process writes one line of JSON
to AIOPROF_SUITE_DIR/<pid>.json (its task count and aioprof's warnings), so the harness can
tell that aioprof really ran in the test processes. AIOPROF_SUITE_INTERVAL (seconds, e.g.
0.001) turns sampling on.
"""
import os

_dir = os.environ.get("AIOPROF_SUITE_DIR")
if _dir:
    import atexit
    import json
    import sys

    def _start():
        import aioprof

        p = aioprof.Profiler(interval_ms=float(os.environ.get("AIOPROF_SUITE_INTERVAL") or 0))

        def _write():  # registered before start(): runs after the profiler's own stop()
            p.stop()
            doc = p.stats()
            with open(os.path.join(_dir, f"{os.getpid()}.json"), "w") as f:
                json.dump({"argv": sys.argv[:3], "tasks": len(doc["tasks"]) + doc["dropped_tasks"],
                           "loops": len(doc["loops"]), "warnings": doc["warnings"]}, f)

        atexit.register(_write)
        p.start()

    try:
        _start()
    except Exception as e:   # the harness finds the missing file; say why here
        sys.stderr.write(f"sitecustomize: aioprof did not start: {e!r}\n")
