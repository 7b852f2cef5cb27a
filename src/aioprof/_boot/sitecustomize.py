"""aioprof --subprocesses: profile this Python process too (see aioprof.subprocesses).

``python -m aioprof --subprocesses`` puts this directory first on the PYTHONPATH its
children inherit, so Python imports this module at startup in every child process that
runs Python. It puts the program's view back (this directory off sys.path; PYTHONPATH and
AIOPROF_SUBPROCESSES in os.environ as the program set them), imports the program's own
sitecustomize if it has one, and then starts aioprof in this process.
"""


def _boot() -> None:
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if not (p and os.path.abspath(p) == here)]
    raw = os.environ.get("AIOPROF_SUBPROCESSES")
    conf = None
    try:
        import json

        conf = json.loads(raw) if raw else None
        # os.environ as the program would see it; the process's environment (inherited
        # by its own children, which are followed too) keeps aioprof's two variables.
        data = os.environ._data  # type: ignore[attr-defined]
        for name, value in (("PYTHONPATH", conf.get("pythonpath") if conf else None),
                            ("AIOPROF_SUBPROCESSES", None)):
            key = os.environ.encodekey(name)  # type: ignore[attr-defined]
            if value is None:
                data.pop(key, None)
            else:
                data[key] = os.environ.encodevalue(value)  # type: ignore[attr-defined]
    except Exception as e:
        sys.stderr.write(f"aioprof: warning: --subprocesses: process {os.getpid()} is not "
                         f"profiled (bad AIOPROF_SUBPROCESSES: {e})\n")
        conf = None
    # The program's own sitecustomize, if any, as site would have imported it.
    me = sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as e:
        if getattr(e, "name", None) != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = me   # none: site needs a module of that name
    if conf:
        home = conf.get("home")
        added = bool(home) and home not in sys.path
        if added:
            sys.path.append(home)
        try:
            from aioprof import subprocesses
        except Exception as e:
            sys.stderr.write(f"aioprof: warning: --subprocesses: process {os.getpid()} is "
                             f"not profiled (cannot import aioprof: {e})\n")
        else:
            subprocesses.start_child(conf)
        finally:
            if added and home in sys.path:
                sys.path.remove(home)


_boot()
del _boot
