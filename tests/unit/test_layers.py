"""The C core's files call each other one way only (docs/design.md, "Layers"):
tools/layers.py passes on src/aioprof/_core, and fails on copies of it into which a call
up a layer, a cycle or a file of no layer was put."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "layers.py"
CORE = ROOT / "src" / "aioprof" / "_core"


def run(core=None):
    args = [sys.executable, str(TOOL)] + (["--core", str(core)] if core else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def graph(stdout):
    """{file: the files it uses}, from the printed graph."""
    res = {}
    for line in stdout.splitlines():
        name, _, uses = line.partition("->")
        res[name.strip()] = set(uses.split()) - {"-"}
    return res


@pytest.fixture(scope="module")
def core_run():
    return run()


def test_core_runs_one_way(core_run):
    assert core_run.returncode == 0, core_run.stderr
    assert core_run.stderr == ""
    g = graph(core_run.stdout)
    assert set(g) == {p.stem for p in CORE.glob("*.c")}
    # The graph was read, not found empty: the edges this layering is about.
    assert {"session", "code"} <= g["stacks"]
    assert {"session", "code", "stacks", "loopstats"} <= g["tasks"]
    assert {"tasks", "monitor", "session"} <= g["hooks"]
    assert {"session", "hooks", "monitor", "snapshot"} <= g["module"]
    assert g["session"] == {"clock", "hist", "table"}
    assert "hooks" not in g["monitor"]
    # Nothing calls into the Python face.
    assert not any("module" in uses for uses in g.values())


@pytest.fixture
def core_copy(tmp_path):
    dst = tmp_path / "_core"
    shutil.copytree(CORE, dst, ignore=shutil.ignore_patterns("*.o", "__pycache__"))
    return dst


def append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


# code.c reaching up into the loop statistics, and trace.c across into them (its own
# layer): no file below calls back, so no cycle either.
@pytest.mark.parametrize("user", ["code", "trace"])
def test_use_not_below_fails(core_copy, user):
    append(core_copy / (user + ".c"),
           "\nvoid ap_%s_probe(ap_loop_t *l)\n{\n    ap_loop_lag(l, 0, 0);\n}\n" % user)
    r = run(core_copy)
    assert r.returncode == 1
    assert r.stderr == "layers: %s.c uses loopstats.c (ap_loop_lag), which is not below it\n" % user


def test_session_asking_the_sampler_fails(core_copy):
    # ap_thread_get asking the sampler, as it did before session.c existed: a cycle, as
    # the sampler uses the session.
    append(core_copy / "session.c",
           "\nvoid ap_session_probe(ap_thread_t *th)\n{\n    ap_sampler_step(th, 0, 1);\n}\n")
    r = run(core_copy)
    assert r.returncode == 1
    assert "layers: session.c uses stacks.c (ap_sampler_step), which is not below it" in r.stderr
    assert "layers: cycle: " in r.stderr


def test_cycle_fails(core_copy):
    # monitor.c taking the hooks, as it did before module.c took them for it.
    append(core_copy / "monitor.c", "\nvoid ap_monitor_probe(void)\n{\n    ap_hooks_release();\n}\n")
    r = run(core_copy)
    assert r.returncode == 1
    assert "layers: monitor.c uses hooks.c (ap_hooks_release), which is not below it" in r.stderr
    assert "layers: cycle: hooks -> monitor -> hooks" in r.stderr


def test_comment_or_string_is_no_use(core_copy):
    append(core_copy / "session.c",
           '\n/* ap_hooks_release() */\nstatic const char *probe_text = "ap_sampler_step";\n')
    r = run(core_copy)
    assert r.returncode == 0, r.stderr


def test_file_of_no_layer_fails(core_copy):
    (core_copy / "extra.c").write_text('#include "profile.h"\nint ap_extra;\n')
    r = run(core_copy)
    assert r.returncode == 1
    assert "layers: extra.c: not in tools/layers.py's ORDER" in r.stderr
