"""`python -m aioprof --metrics HOST:PORT`: /metrics served while the program runs, from
prometheus_client's server in a daemon thread; a bad address, a port in use or a missing
prometheus_client is one line and exit status 2 before the program runs."""
from __future__ import annotations

import errno
import os
import socket
import sys
import textwrap

import pytest

from conftest import importable
from test_cli import run, write

if not importable("prometheus_client"):
    reason = f"prometheus_client is not installed for {sys.executable} (tests/requirements.txt)"
    if os.environ.get("AIOPROF_REQUIRE_REAL"):
        pytest.fail(f"{reason} (AIOPROF_REQUIRE_REAL is set)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

# The program reads its own /metrics (from a thread: the loop stays free to be measured),
# then exits with status 3, which must pass through.
SCRAPES_ITSELF = """\
    import asyncio, sys, time, urllib.request

    async def spin():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.03:
            pass

    async def main(url):
        await asyncio.create_task(spin())
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read().decode())
        for line in body.splitlines():
            if line.startswith(("aioprof_coroutine_busy_seconds_total", "aioprof_loop_ticks_total",
                                "# TYPE aioprof_loop_lag_seconds ")):
                print(line)

    asyncio.run(main(sys.argv[1]))
    print("ran")
    sys.exit(3)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_served_while_the_program_runs(tmp_path):
    port = free_port()
    prog = write(tmp_path / "prog.py", SCRAPES_ITSELF)
    proc = run([str(prog), f"http://127.0.0.1:{port}/metrics"], cwd=tmp_path,
               aioprof=["--metrics", f"127.0.0.1:{port}", "-o", os.devnull])
    out = proc.stdout.decode().splitlines()
    assert proc.returncode == 3, proc.stderr.decode()
    assert out[-1] == "ran"
    assert "# TYPE aioprof_loop_lag_seconds histogram" in out
    busy = {line.split("{")[1].split("}")[0]: float(line.split()[-1])
            for line in out if line.startswith("aioprof_coroutine_busy_seconds_total")}
    assert busy['coroutine="spin"'] >= 0.03    # it spun for 30 ms by its own clock
    (ticks,) = [line for line in out if line.startswith("aioprof_loop_ticks_total")]
    assert 'loop="1"' in ticks and float(ticks.split()[-1]) > 0


@pytest.mark.parametrize("address", ["127.0.0.1", ":9464", "127.0.0.1:0", "127.0.0.1:65536",
                                     "127.0.0.1:http", "localhost:-1"])
def test_bad_address_is_one_line_before_the_program(tmp_path, address):
    prog = write(tmp_path / "prog.py", "print('ran')\n")
    proc = run([str(prog)], cwd=tmp_path, aioprof=["--metrics", address])
    assert proc.returncode == 2
    assert proc.stdout == b""
    err = proc.stderr.decode().splitlines()
    assert err == [f"aioprof: error: argument --metrics: invalid HOST:PORT address "
                   f"(e.g. 127.0.0.1:9464) value: {address!r}"]


def test_port_in_use_is_one_line_before_the_program(tmp_path):
    prog = write(tmp_path / "prog.py", "print('ran')\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run([str(prog)], cwd=tmp_path, aioprof=["--metrics", f"127.0.0.1:{port}"])
    assert proc.returncode == 2 and proc.stdout == b""
    assert proc.stderr.decode().splitlines() == [
        f"aioprof: error: argument --metrics: cannot serve on 127.0.0.1:{port}: "
        f"{os.strerror(errno.EADDRINUSE)}"]


def test_missing_prometheus_client_is_one_line(tmp_path):
    prog = write(tmp_path / "prog.py", "print('ran')\n")
    # The program never runs: python -c stands in for a python without prometheus_client.
    boot = textwrap.dedent(f"""\
        import sys
        sys.modules["prometheus_client"] = None     # import prometheus_client fails
        from aioprof.cli import main
        main(["--metrics", "127.0.0.1:{free_port()}", {str(prog)!r}])
    """)
    proc = run(["-c", boot], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == b""
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith("aioprof: error: --metrics needs prometheus_client, which cannot be "
                           "imported here") and line.endswith("pip install prometheus-client)")
