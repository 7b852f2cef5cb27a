"""gunicorn with 2 aiohttp workers in prometheus_client's multiprocess mode, as
docs/prometheus.md ("Several processes") tells: the test runs the configuration printed
there (read from the doc itself, its port moved to a free one) with PROMETHEUS_MULTIPROC_DIR
set to an empty directory. Each worker publishes its aioprof figures into the value files;
the master serves them merged. The merged count of request-handler tasks must reach exactly
the number of responses (from both workers, whose pids the responses carry), with one
utilization series per worker; after gunicorn's graceful stop (each worker's last publish
at its exit) the files alone must give that count, and the handlers' busy time at least
the blocking they measured themselves.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from _real import PROGRAMS, _env, need
from test_gunicorn_metrics import documented_config, free_ports, get, stop

pytestmark = pytest.mark.timing

HANDLER = "RequestHandler._handle_request"
DEADLINE = 90.0
WORKERS = 2


def merged(body: str) -> dict:
    """{(sample name, frozenset(labels)): value} of an exposition, by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples}


def handler_figure(samples: dict, name: str) -> float:
    return samples.get((name, frozenset({("coroutine", HANDLER)})), 0.0)


def utilization_pids(samples: dict) -> set:
    return {dict(labels)["pid"] for name, labels in samples if name == "aioprof_loop_utilization"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    need("gunicorn", "aiohttp", "prometheus_client")
    tmp = tmp_path_factory.mktemp("gunicorn_mp")
    mdir = tmp / "prometheus"
    mdir.mkdir()
    app_port = free_ports(2)
    metrics_port = app_port + 1
    config = documented_config(", multiprocess mode").replace("9501", str(metrics_port))
    assert str(metrics_port) in config
    (tmp / "gunicorn.conf.py").write_text(config)
    deadline = time.monotonic() + DEADLINE
    log = open(tmp / "gunicorn.log", "w+")
    env = _env({"PYTHONPATH": os.pathsep.join([str(PROGRAMS), _env(None)["PYTHONPATH"]]),
                "PROMETHEUS_MULTIPROC_DIR": str(mdir)})
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(tmp / "gunicorn.conf.py"),
                             "-b", f"127.0.0.1:{app_port}", "gunicorn_app:app"],
                            cwd=str(tmp), env=env, stdout=log, stderr=log)
    answered: dict = {}
    live = None

    def fail(what):
        log.seek(0)
        pytest.fail(f"{what} (gunicorn exit {proc.poll()}):\n{log.read()}")

    try:
        sent = 0
        while len(answered) < WORKERS or sent < 10:   # both workers answer some requests
            if proc.poll() is not None or time.monotonic() > deadline or sent >= 400:
                fail(f"{len(answered)} worker(s) answered {sent} request(s)")
            try:
                r = json.loads(get(f"http://127.0.0.1:{app_port}/work"))
            except OSError:   # not listening yet
                time.sleep(0.1)
                continue
            answered.setdefault(r["pid"], []).append(r)
            sent += 1
        # The merged endpoint catches up within a publish interval of each worker.
        while True:
            try:
                samples = merged(get(f"http://127.0.0.1:{metrics_port}/metrics").decode())
            except OSError:
                samples = {}
            if handler_figure(samples, "aioprof_coroutine_tasks_total") == sent \
                    and utilization_pids(samples) == {str(pid) for pid in answered}:
                live = samples
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"merged metrics never counted the {sent} requests: "
                     f"{handler_figure(samples, 'aioprof_coroutine_tasks_total')}")
            time.sleep(0.2)
    finally:
        stop(proc)   # graceful: each worker's last publish as it exits
        log.seek(0)
        text = log.read()
        log.close()
    assert proc.returncode == 0, text
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=str(mdir))
    final = merged(generate_latest(reg).decode())
    return answered, live, final, text, sorted(os.listdir(mdir))


def test_the_merged_endpoint_counts_every_response(run):
    answered, live, _, _, _ = run
    assert len(answered) == WORKERS
    # Reached in the fixture: exactly the responses of both workers, one series per worker.
    assert handler_figure(live, "aioprof_coroutine_tasks_total") == sum(len(rs) for rs in answered.values())
    assert utilization_pids(live) == {str(pid) for pid in answered}
    assert live[("aioprof_tasks_finished_total", frozenset({("state", "done")}))] >= \
        sum(len(rs) for rs in answered.values())


def test_the_files_keep_the_final_figures_after_the_workers_exit(run):
    answered, _, final, log, files = run
    assert "multiprocess metrics stopped" not in log
    responses = [r for rs in answered.values() for r in rs]
    assert handler_figure(final, "aioprof_coroutine_tasks_total") == len(responses)
    # Together, the handlers ran at least as long as they blocked by their own clocks.
    busy = handler_figure(final, "aioprof_coroutine_busy_seconds_total")
    assert busy >= sum(r["blocked_s"] for r in responses) - 0.001 * len(responses)
    # child_exit's mark_process_dead took the dead workers' live gauges out of the merge
    # (while the counters stay in the sum).
    assert utilization_pids(final) == set()
    assert not [name for name, _ in final if name == "aioprof_tasks"]
    assert files and not [f for f in files if f.startswith("gauge_live")]
