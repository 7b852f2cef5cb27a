"""A real Prometheus server scrapes `python -m aioprof --metrics` and answers for it.

The test starts programs/aiohttp_app.py (REAL_HOLD=1) under `python -m aioprof --metrics
127.0.0.1:PORT --format json -o report.json`; once the program has served its requests (it
prints "served", its handlers' figures final), it starts Debian's `prometheus` on 127.0.0.1
with a temporary config and data directory, scraping that port every 0.5 s, and queries
its HTTP API (/api/v1/query) until every series below has a value, within a deadline.
Then both processes are stopped (always: the fixture's finally), and the tests compare
what Prometheus stored with what the program measured itself (perf_counter around its
waits and blocking) and with aioprof's own JSON report of the same run.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

import pytest

from _real import AFTER, EARLY, PROGRAMS, STEP_SLACK, _env, need, skip_or_fail

pytestmark = pytest.mark.timing

HANDLER = "RequestHandler._handle_request"   # aiohttp's task per request: the handler's
QUERIES = {
    "up": 'up{job="aioprof"}',
    "busy": f'aioprof_coroutine_busy_seconds_total{{coroutine="{HANDLER}"}}',
    "idle": f'aioprof_coroutine_idle_seconds_total{{coroutine="{HANDLER}"}}',
    "tasks": f'aioprof_coroutine_tasks_total{{coroutine="{HANDLER}"}}',
    "loop_busy": 'aioprof_loop_busy_seconds_total{loop="1"}',
    "loop_wall": 'aioprof_loop_wall_seconds_total{loop="1"}',
    "utilization": 'aioprof_loop_utilization{loop="1"}',
    "ticks": 'aioprof_loop_ticks_total{loop="1"}',
    "lag_count": 'aioprof_loop_lag_seconds_count{loop="1"}',
    "lag_inf": 'aioprof_loop_lag_seconds_bucket{loop="1",le="+Inf"}',
    "lag_p99": 'histogram_quantile(0.99, aioprof_loop_lag_seconds_bucket{loop="1"})',
    "idle_tasks": 'aioprof_tasks{state="idle"}',
}
DEADLINE = 30.0     # seconds for the whole exchange; it takes about 2 s on an idle machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, promql: str, at: Optional[float] = None) -> list:
    """The result of an instant query, evaluated now or at time `at`."""
    params = {"query": promql} if at is None else {"query": promql, "time": repr(at)}
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for_line(proc: "subprocess.Popen[str]", expected: str, deadline: float) -> bool:
    """Read the program's stdout (in a thread) until the line `expected` (True), its end or
    the deadline."""
    import threading
    seen = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if line.strip() == expected:
                seen.set()
        seen.set()   # its end: the caller sees the exit status

    threading.Thread(target=read, daemon=True).start()
    return seen.wait(max(0.0, deadline - time.monotonic())) and proc.poll() is None


def stop(proc: "subprocess.Popen", how: str = "terminate") -> None:
    if proc.poll() is None:
        getattr(proc, how)()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    need("aiohttp", "prometheus_client")
    prometheus = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if prometheus is None:
        skip_or_fail("the Prometheus server is not installed (Debian package prometheus; "
                     "tools/install-deps.sh)")
    tmp = tmp_path_factory.mktemp("prometheus")
    deadline = time.monotonic() + DEADLINE
    mport, pport = free_port(), free_port()
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 500ms\n  scrape_timeout: 400ms\n"
        "scrape_configs:\n  - job_name: aioprof\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{mport}']\n")
    errlog = open(tmp / "app.stderr", "w+")
    app = prom = None
    results: dict = {}
    try:
        # Prometheus first: it takes about 5 s to start scraping a new target (its target
        # discovery updates every 5 s), time the program uses to start and serve.
        prom = subprocess.Popen(
            [prometheus, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{pport}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"), cwd=str(tmp))
        started = time.monotonic()
        app = subprocess.Popen(
            [sys.executable, "-m", "aioprof", "--metrics", f"127.0.0.1:{mport}", "--format", "json",
             "-o", str(tmp / "report.json"), str(PROGRAMS / "aiohttp_app.py"), str(tmp / "measured.json")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, text=True,
            env=_env({"REAL_HOLD": "1"}),
            cwd=str(tmp))
        if not wait_for_line(app, "served", deadline):
            errlog.seek(0)
            pytest.fail(f"the program did not serve (exit {app.poll()}):\n{errlog.read()}")
        served = time.time()    # the handlers' figures are final from before this instant
        while time.monotonic() < deadline and len(results) < len(QUERIES):
            if prom.poll() is not None:
                pytest.fail(f"prometheus exited {prom.returncode}:\n{(tmp / 'prometheus.log').read_text()}")
            try:
                # The newest scrape: its samples all have the time the scrape began, so
                # every query evaluated at that time reads that one scrape.
                last = query(pport, 'timestamp(up{job="aioprof"})')
                scrape = float(last[0]["value"][1]) if last else 0.0
                if scrape > served:
                    for key, promql in QUERIES.items():
                        found = query(pport, promql, at=scrape)
                        if found:
                            results[key] = float(found[0]["value"][1])
            except OSError:   # not listening yet
                pass
            if len(results) < len(QUERIES):
                results.clear()   # all from one scrape, or none
                time.sleep(0.2)
        lifetime = time.monotonic() - started   # the program's running time, at least
        missing = sorted(set(QUERIES) - set(results))
        if missing:
            pytest.fail(f"no answer from Prometheus for {missing} within {DEADLINE} s:\n"
                        f"{(tmp / 'prometheus.log').read_text()[-3000:]}")
    finally:
        if prom is not None:
            stop(prom)
        if app is not None:
            try:
                app.stdin.close()     # the program ends, aioprof writes its report
            except OSError:
                pass
            try:
                app.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop(app, "kill")
        errlog.close()
    assert app.returncode == 0, (tmp / "app.stderr").read_text()
    report = json.loads((tmp / "report.json").read_text())
    measured = json.loads((tmp / "measured.json").read_text())
    return results, report, measured, lifetime


def test_server_was_scraped(scraped):
    results, _, _, _ = scraped
    assert results["up"] == 1


def test_handler_series_match_the_program_and_the_report(scraped):
    results, report, measured, _ = scraped
    reqs = measured["requests"]
    assert len(reqs) == 3 and measured["sleep_s"] > 0
    (row,) = [c for c in report["coroutines"] if c["coroutine"] == HANDLER]
    # The handlers ended before Prometheus started: it stored their final figures, which
    # are the report's, to the nanosecond (both read the same counters).
    assert results["busy"] == pytest.approx(row["busy_s"], abs=1e-9)
    assert results["idle"] == pytest.approx(row["idle_s"], abs=1e-9)
    assert results["tasks"] == row["tasks"] >= 3
    # And the program's own clock: the blocking is busy time, the sleep idle time.
    blocked = sum(r["blocked_s"] for r in reqs)
    waited = sum(r["await_s"] for r in reqs)
    roundtrips = sum(r["roundtrip_s"] for r in reqs)
    assert results["busy"] >= blocked - 0.001 * len(reqs)
    assert results["busy"] + results["idle"] <= roundtrips + STEP_SLACK * len(reqs)
    assert results["idle"] >= len(reqs) * measured["sleep_s"] - EARLY * len(reqs)
    assert results["idle"] <= waited + AFTER * len(reqs) + STEP_SLACK * len(reqs)


def test_loop_series_are_sane(scraped):
    results, report, measured, lifetime = scraped
    (loop,) = [lp for lp in report["loops"] if lp["id"] == 1]
    blocked = sum(r["blocked_s"] for r in measured["requests"])
    # Counters only grow: what Prometheus stored is at most the final report's figure.
    assert blocked - 0.003 <= results["loop_busy"] <= loop["busy_s"]
    assert results["loop_busy"] <= results["loop_wall"] <= lifetime
    assert 0 < results["utilization"] <= 1
    assert 0 < results["ticks"] <= loop["ticks"]
    assert 0 < results["lag_count"] == results["lag_inf"] <= loop["lag_count"]
    assert 0 <= results["lag_p99"] <= loop["lag_max_s"] * 2   # an upper bucket bound: within 2x
    assert results["idle_tasks"] >= 1    # the server's tasks, waiting
