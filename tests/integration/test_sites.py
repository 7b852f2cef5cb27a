"""Where tasks wait and where they were made, on real programs with real sleeps.

Each program runs once under ``python -m aioprof --format json`` (a module-scoped fixture
per program) and prints what it measured itself; the figures at the program's lines are
checked against those measurements, never against a quiet machine's timings. The lower
bounds use the sleeps' own lengths: a suspension is idle until its timer is due, however
loaded the machine, and load only adds scheduled time after that.
"""
from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest

from aioprof import report

REPO = Path(__file__).resolve().parent.parent.parent


def profile_program(run_aioprof, tmp_path: Path, source: str, *args: str) -> Dict[str, Any]:
    """Run `source` (written to tmp_path/app.py) under aioprof; its stdout's last line is
    its own JSON. Returns {"doc", "own", "file", "lines"} (lines: marker -> line)."""
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(source))
    out = tmp_path / "prof.json"
    proc = run_aioprof(["--format", "json", "-o", out, app, *args], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["warnings"] == [], doc["warnings"]
    lines = {}
    for n, text in enumerate(app.read_text().splitlines(), 1):
        if "# [" in text:
            lines[text.split("# [", 1)[1].split("]", 1)[0]] = n
    return {"doc": doc, "own": json.loads(proc.stdout.strip().splitlines()[-1]), "file": str(app),
            "lines": lines}


def site_at(doc: Dict[str, Any], file: str, line: int) -> Dict[str, Any]:
    (site,) = [s for s in doc["sites"] if s["file"] == file and s["line"] == line]
    return site


def await_sites_of(doc: Dict[str, Any], coroutine_suffix: str) -> Dict[tuple, List[float]]:
    """(file basename, line) -> [idle_s, count, busy_s], summed over the tasks of a
    coroutine that waited there (busy_s: of those tasks)."""
    out: Dict[tuple, List[float]] = {}
    for t in doc["tasks"]:
        if not t["coroutine"].endswith(coroutine_suffix):
            continue
        for a in t["await_sites"]:
            acc = out.setdefault((os.path.basename(a["file"]), a["line"]), [0.0, 0, 0.0])
            acc[0] += a["idle_s"]
            acc[1] += a["count"]
            acc[2] += t["busy_s"]
    return out


# --------------------------------------------------------------------------- aiohttp handler

AIOHTTP_HANDLER = """
    import asyncio, json, time
    from aiohttp import ClientSession, web

    N = 10
    waited = []

    async def handler(request):
        t0 = time.perf_counter()
        await asyncio.sleep(0.05)  # [HANDLER_WAIT]
        waited.append(time.perf_counter() - t0)
        return web.Response(text="ok")

    async def main():
        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with ClientSession() as session:
            for _ in range(N):
                async with session.get(f"http://127.0.0.1:{port}/") as resp:
                    assert await resp.text() == "ok"
        await runner.cleanup()
        print(json.dumps({"n": len(waited), "waited": sum(waited)}))

    asyncio.run(main())
"""


@pytest.fixture(scope="module")
def handler_run(run_aioprof_module, tmp_path_factory):
    pytest.importorskip("aiohttp")
    return profile_program(run_aioprof_module, tmp_path_factory.mktemp("aiohttp"), AIOHTTP_HANDLER)


def test_aiohttp_handler_wait_is_idle_at_its_line(handler_run):
    """aiohttp runs each request in a task of its own; on 3.12+ it starts that task eagerly
    (Task(..., eager_start=True)), so the handler's only wait is the task's first
    suspension. It is idle at the handler's await line on every version."""
    doc, own, line = handler_run["doc"], handler_run["own"], handler_run["lines"]["HANDLER_WAIT"]
    n, waited = own["n"], own["waited"]
    assert n == 10
    site = site_at(doc, handler_run["file"], line)
    assert site["innermost_count"] == n
    handlers = [t for t in doc["tasks"] if t["coroutine"].endswith("_handle_request")]
    assert len(handlers) == n
    # Idle from the end of the step to the timer's due time: the 50 ms asked for, less the
    # part of the step after sleep() read the loop's clock (busy time, however long a
    # loaded machine makes it); at most what the handler measured around its await
    # (which adds the scheduled time and more).
    assert n * 0.05 - sum(t["busy_s"] for t in handlers) - 1e-4 <= site["innermost_idle_s"] <= waited
    for t in handlers:
        (a,) = [a for a in t["await_sites"] if a["line"] == line]
        assert a["count"] == 1 and 0.05 - t["busy_s"] - 1e-5 <= a["idle_s"] <= t["idle_s"] + 1e-9
        assert t["created_at"] is not None   # made in aiohttp's web_protocol.py


# --------------------------------------------------------------------------- make demo

@pytest.fixture(scope="module")
def demo_run(run_aioprof_module, tmp_path_factory):
    pytest.importorskip("aiohttp")
    tmp = tmp_path_factory.mktemp("demo")
    out = tmp / "demo.json"
    proc = run_aioprof_module(["--format", "json", "-o", out, "--max-tasks", "100000",
                               REPO / "examples" / "webserver.py", "--seconds", "1", "--clients", "4"], cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    requests = {}
    for text in proc.stdout.splitlines():
        parts = text.split()
        if parts and parts[0].startswith("/"):
            requests[parts[0]] = int(parts[1])
    doc = json.loads(out.read_text())
    assert doc["warnings"] == []
    return doc, requests


def test_demo_reading_in_readme(demo_run):
    """README.md's reading of `make demo`: the request handlers wait at the /search gather
    (webserver.py:111) and at the fake database call (webserver.py:51), on every version
    (the handlers are eager tasks on 3.12+). Every /items request waits 5 ms at line 51,
    every /search request at least 8 ms at line 111 (its slowest sub-query)."""
    doc, requests = demo_run
    assert requests["/items"] > 0 and requests["/search"] > 0, requests
    assert doc["dropped_tasks"] == 0
    sites = await_sites_of(doc, "_handle_request")
    idle51, count51, busy51 = sites[("webserver.py", 51)]
    idle111, count111, busy111 = sites[("webserver.py", 111)]
    # Each wait is idle for its sleep (5 ms; the gather's slowest sub-query 8 ms) less the
    # part of its step after the sleep began (busy time of those tasks, however long).
    assert count51 >= requests["/items"] and idle51 >= count51 * 0.005 - busy51 - 1e-3
    assert count111 >= requests["/search"] and idle111 >= count111 * 0.008 - busy111 - 1e-3
    # The text report's "Where the top coroutines wait" names both lines.
    buf = io.StringIO()
    report.write(doc, format="text", file=buf)
    text = buf.getvalue()
    section = text.split("Where the top coroutines wait", 1)[1].split("\n\n", 1)[0]
    assert "webserver.py:111 in search" in section and "webserver.py:51 in _round_trip" in section, section
