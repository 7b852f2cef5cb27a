"""Real programs under aioprof (programs/; how they are run and checked: _real.py).

One run of each program (plain, then profiled) per module-scoped fixture; its tests assert
aioprof's figures at the program's own lines against what the program measured.
Known gaps of aioprof that other work fixes are strict xfails (XFAIL below), so that the
fix turns them into failures to flip."""
import sys

import pytest

import _real as R

pytestmark = [pytest.mark.slow, pytest.mark.timing]

PY312 = sys.version_info >= (3, 12)

# name: (program, packages, env, suspensions per request at [IDLE] or None for >= 1,
#        tasks created at [SPAWN])
PROGRAMS = {
    "fastapi": ("fastapi_uvicorn.py", ("fastapi", "uvicorn", "httpx"), {}, 1, 3),
    "aiohttp": ("aiohttp_app.py", ("aiohttp",), {}, 1, 3),
    "aiohttp-uvloop": ("aiohttp_app.py", ("aiohttp", "uvloop"), {"REAL_LOOP": "uvloop"}, 1, 3),
    "websockets": ("websockets_echo.py", ("websockets",), {}, 1, 3),
    "sqlalchemy": ("sqlalchemy_aiosqlite.py", ("sqlalchemy", "aiosqlite", "greenlet"), {}, None, 3),
    "asyncpg": ("asyncpg_pg_sleep.py", ("asyncpg",), {}, None, 3),
    "anyio": ("anyio_jobs.py", ("anyio",), {}, 1, 3),
    "nest_asyncio": ("nest_asyncio_nested.py", ("nest_asyncio",), {}, 1, 3),
    "django": ("django_uvicorn.py", ("django", "uvicorn", "httpx"), {}, 1, 3),
    "grpc": ("grpc_aio.py", ("grpc",), {}, 1, 3),
}

# (program, test) -> (condition, reason): the known gaps, as strict xfails.
ITEM17 = (True, "issue 7 item 17: nest_asyncio's nested runs: the tasks run inside get no steps")
XFAIL = {
    ("nest_asyncio", "idle"): ITEM17, ("nest_asyncio", "await_site"): ITEM17,
    ("nest_asyncio", "busy"): ITEM17,
}


def xfail_known(request, name, test):
    cond, reason = XFAIL.get((name, test), (False, ""))
    if cond:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(scope="module")
def postgres():
    proc, host = R.start_postgres()
    yield host
    R.stop_postgres(proc, host)


@pytest.fixture(scope="module", params=list(PROGRAMS))
def run(request, tmp_path_factory):
    name = request.param
    program, packages, env, _, _ = PROGRAMS[name]
    R.need(*packages)
    env = dict(env)
    if name == "asyncpg":
        env["REAL_PGHOST"] = request.getfixturevalue("postgres")
    r = R.run_program(program, tmp_path_factory.mktemp(name), env=env)
    r.name = name
    return r


def test_same_as_plain(run, request):
    xfail_known(request, run.name, "same_as_plain")
    R.check_same_as_plain(run)
    assert len(run.prof.stdout.splitlines()) == len(run.measured["requests"]) == 3


def test_idle_at_await_line(run, request):
    xfail_known(request, run.name, "idle")
    R.check_idle_at(run, per_request=PROGRAMS[run.name][3])


def test_await_site_is_the_user_line(run, request):
    xfail_known(request, run.name, "await_site")
    R.check_await_site(run)


def test_busy_of_handler_task(run, request):
    xfail_known(request, run.name, "busy")
    R.check_busy(run)


def test_creation_sites(run, request):
    xfail_known(request, run.name, "created_at")
    R.check_created_at(run, "SPAWN", PROGRAMS[run.name][4])
    if run.name == "anyio":   # made inside anyio: the library's line beside the program's
        vias = [(t["created_at"]["via"] or {}).get("file") or "" for t in run.created_at("SPAWN")]
        assert all("/anyio/" in f.replace("\\", "/") for f in vias), vias
    if run.name == "grpc":    # handler tasks made by grpc's compiled code (issue 7 item 19)
        assert [t["coroutine"] for t in run.created_at("RUN")] == ["main"]
        sites = [t["created_at"] or {} for t, _, _ in run.through("IDLE")]
        assert len(sites) == 3 and all(s.get("line") is None and s.get("function")
                                       and not run.is_program(s.get("file")) for s in sites), sites
