"""gunicorn with 2 workers, each serving its own aioprof metrics, as docs/prometheus.md
("Without multiprocess mode") tells: the test runs the configuration printed there (read from the
doc itself, with its ports moved to free ones), sends requests until both workers have
answered some, and reads each worker's /metrics. Each worker's count of request-handler
tasks must be the number of requests it answered (the responses carry its pid), and its
handlers' busy time at least the blocking it measured itself for them.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from _real import PROGRAMS, REPO, _env, need

pytestmark = pytest.mark.timing

HANDLER = "RequestHandler._handle_request"
DEADLINE = 60.0
WORKERS = 2


def documented_config(kind: str = ": each worker") -> str:
    """The gunicorn.conf.py block of docs/prometheus.md whose first line goes on with `kind`."""
    text = (REPO / "docs" / "prometheus.md").read_text(encoding="utf-8")
    m = re.search(r"```python\n(# gunicorn\.conf\.py" + re.escape(kind) + r".*?)```", text, re.S)
    assert m, f"docs/prometheus.md has no gunicorn.conf.py{kind} block"
    return m.group(1)


def free_ports(n: int) -> int:
    """The first of n consecutive ports that are free now."""
    import socket
    for base in range(20000 + os.getpid() % 20000, 65000, 7):
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free ports")


def get(url: str) -> bytes:
    req = urllib.request.Request(url, headers={"Connection": "close"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def samples(body: str, name: str) -> dict:
    out = {}
    for line in body.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1:].rsplit("} ", 1)
            out[labels] = float(value)
    return out


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """gunicorn's graceful stop (SIGTERM: the workers included), killed past `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    need("gunicorn", "aiohttp", "prometheus_client")
    tmp = tmp_path_factory.mktemp("gunicorn")
    base = free_ports(WORKERS + 1)
    app_port, metrics_base = base, base + 1
    config = documented_config().replace("9501", str(metrics_base))
    assert str(metrics_base) in config
    (tmp / "gunicorn.conf.py").write_text(config)
    deadline = time.monotonic() + DEADLINE
    log = open(tmp / "gunicorn.log", "w+")
    env = _env({"PYTHONPATH": os.pathsep.join([str(PROGRAMS), _env(None)["PYTHONPATH"]])})
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(tmp / "gunicorn.conf.py"),
                             "-b", f"127.0.0.1:{app_port}", "gunicorn_app:app"],
                            cwd=str(tmp), env=env, stdout=log, stderr=log)
    answered: dict = {}
    scraped: dict = {}
    respawned: list = []
    try:
        for port in range(metrics_base, metrics_base + WORKERS):   # both workers serve
            while True:
                try:
                    get(f"http://127.0.0.1:{port}/metrics")
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        pytest.fail(f"no metrics on port {port} (gunicorn exit {proc.poll()}):\n{log.read()}")
                    time.sleep(0.1)
        sent = 0
        while (len(answered) < WORKERS or sent < 10) and time.monotonic() < deadline and sent < 400:
            r = json.loads(get(f"http://127.0.0.1:{app_port}/work"))
            answered.setdefault(r["pid"], []).append(r)
            sent += 1
        for port in range(metrics_base, metrics_base + WORKERS):
            scraped[port] = get(f"http://127.0.0.1:{port}/metrics").decode()
        # A worker killed: gunicorn starts another, which takes the port the dead one left.
        victim, survivor = list(answered)[:2]
        os.kill(victim, signal.SIGKILL)
        label = f'coroutine="{HANDLER}"'
        while time.monotonic() < deadline:
            try:
                counts = sorted(samples(get(f"http://127.0.0.1:{port}/metrics").decode(),
                                        "aioprof_coroutine_tasks_total").get(label, 0)
                                for port in range(metrics_base, metrics_base + WORKERS))
            except OSError:      # the dead worker's port, not taken yet
                counts = None
            if counts == [0, len(answered[survivor])]:
                respawned.append(counts)
                break
            time.sleep(0.1)
    finally:
        stop(proc)
        log.close()
    return answered, scraped, respawned


def test_each_worker_serves_its_own_figures(workers):
    answered, scraped, _ = workers
    assert len(answered) == WORKERS, f"only {len(answered)} worker(s) answered"
    label = f'coroutine="{HANDLER}"'
    tasks = [samples(body, "aioprof_coroutine_tasks_total").get(label, 0) for body in scraped.values()]
    busy = [samples(body, "aioprof_coroutine_busy_seconds_total").get(label, 0.0) for body in scraped.values()]
    # Each endpoint is one worker: its handler tasks are the requests that worker answered
    # (which endpoint is which pid is not said: the counts are compared as a multiset).
    assert sorted(tasks) == sorted(len(rs) for rs in answered.values())
    assert all(t > 0 for t in tasks)
    # Together, the handlers ran at least as long as they blocked by their own clocks.
    blocked = [r["blocked_s"] for rs in answered.values() for r in rs]
    assert sum(busy) >= sum(blocked) - 0.001 * len(blocked)


def test_a_new_worker_takes_the_port_of_a_dead_one(workers):
    answered, _, respawned = workers
    assert len(answered) == WORKERS
    # Both ports serve again: the survivor's figures, and the new worker's (no requests yet).
    assert respawned, "the killed worker's port was not served again before the deadline"
