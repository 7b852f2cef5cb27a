"""Waits inside a library, and tasks a library creates, are shown at the program's own
line, the library's beside it.

"Where the top coroutines wait" names the innermost line of the program's own code (not
in the standard library, site-packages, dist-packages or aioprof), with the library
frame it waits in: ``app.py:12 (via anyio/_backends/_asyncio.py:2665)``. The library
here is a package put on sys.path from a site-packages directory in tmp_path.
"""
import asyncio
import importlib
import io
import sys
import textwrap

import pytest

import aioprof
from aioprof import report
from test_fake_clock import MS, fake_clock, line_of, ns  # noqa: F401  (fake_clock: a fixture)

pytestmark = pytest.mark.sanitize

LIBRARY = """\
    import asyncio

    async def wait(ev):
        await ev.wait()  # [LIB_WAIT]

    async def call(fn, *args):
        return await fn(*args)

    async def background(adv, ev):
        adv(1_000_000)
        await wait(ev)

    def spawn(coro, name):
        return asyncio.create_task(coro, name=name)  # [LIB_SPAWN]

    class Group:   # as anyio's TaskGroup.start_soon: two frames of the library deep
        def start_soon(self, fn, *args, name):
            return self._spawn(fn(*args), name)  # [LIB_START_SOON]

        def _spawn(self, coro, name):
            return asyncio.get_running_loop().create_task(coro, name=name)  # [LIB_DEEP]

    async def own_task(coro):   # the library's own task makes one: no line of the program
        await asyncio.create_task(coro, name="own")  # [LIB_OWN]
"""


@pytest.fixture
def fakelib(tmp_path):
    site = tmp_path / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "fakelib").mkdir(parents=True)
    init = site / "fakelib" / "__init__.py"
    init.write_text(textwrap.dedent(LIBRARY))
    sys.path.insert(0, str(site))
    try:
        lib = importlib.import_module("fakelib")
        text = init.read_text().splitlines()
        lib.line = lambda marker: next(n for n, t in enumerate(text, 1) if f"[{marker}]" in t)
        lib.WAIT_LINE = lib.line("LIB_WAIT")
        yield lib
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("fakelib", None)


async def handler(lib, adv, ev):
    adv(3 * MS)
    await lib.wait(ev)  # [USER_WAIT]


async def user_inner(ev):
    await ev.wait()  # [USER_INNER]


async def via_callback(lib, adv, ev):
    adv(2 * MS)
    await lib.call(user_inner, ev)


async def main(lib, adv):
    ev = asyncio.Event()
    tasks = [asyncio.create_task(handler(lib, adv, ev)) for _ in range(2)]
    tasks += [asyncio.create_task(via_callback(lib, adv, ev)), asyncio.create_task(lib.background(adv, ev))]

    def later():   # after the four first steps (0-9 ms): all ready at 14 ms
        adv(5 * MS)
        ev.set()

    asyncio.get_running_loop().call_soon(later)
    await asyncio.gather(*tasks)


def test_library_waits_at_the_programs_line(fake_clock, fakelib):
    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        asyncio.run(main(fakelib, fake_clock))
    doc = p.stats()
    assert doc["warnings"] == []
    user_wait, user_inner_line = line_of(handler, "[USER_WAIT]"), line_of(user_inner, "[USER_INNER]")

    def sites_of(suffix):
        return [a for t in doc["tasks"] if t["coroutine"].endswith(suffix) for a in t["await_sites"]]

    # JSON: the await site stays the innermost frame outside asyncio (the library's);
    # user_site is the innermost line of the program's own code.
    for a in sites_of("handler"):
        assert (a["file"], a["line"]) == (fakelib.__file__, fakelib.WAIT_LINE)
        assert (a["user_site"]["file"], a["user_site"]["line"]) == (__file__, user_wait)
        assert a["user_site"]["function"].endswith("handler")
    (a,) = sites_of("via_callback")   # the library called back into the program: its line
    assert a["line"] == user_inner_line and a["user_site"]["line"] == user_inner_line
    (a,) = sites_of("background")     # the library's own task: no line of the program
    assert a["line"] == fakelib.WAIT_LINE and a["user_site"] is None

    buf = io.StringIO()
    report.write(doc, format="text", file=buf, width=200)
    section = buf.getvalue().split("Where the top coroutines wait", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("x  ", 1)[1] for line in section.splitlines() if " ms idle " in line]
    here = __file__.rsplit("/", 1)[-1]
    assert rows == [f"{here}:{user_wait} (via fakelib/__init__.py:{fakelib.WAIT_LINE})",
                    f"{here}:{user_inner_line} in user_inner", f"__init__.py:{fakelib.WAIT_LINE} in wait"], section
    # Idle: the handlers 3-14 and 6-14 ms, via_callback 8-14, background 9-14.
    idles = [line.split(" ms idle", 1)[0].split()[-1] for line in section.splitlines() if " ms idle " in line]
    assert idles == ["19.0", "6.0", "5.0"], section


async def child():
    await asyncio.sleep(0)


async def spawner(lib):
    tasks = [lib.spawn(child(), "spawned")]  # [USER_SPAWN]
    tasks.append(lib.Group().start_soon(child, name="deep"))  # [USER_START_SOON]
    tasks.append(asyncio.create_task(lib.own_task(child()), name="own_parent"))  # [USER_OWN]
    tasks.append(asyncio.create_task(child(), name="direct"))  # [USER_DIRECT]
    await asyncio.gather(*tasks)


@pytest.fixture
def spawned(fakelib):
    with aioprof.Profiler() as p:
        asyncio.run(spawner(fakelib))
    doc = p.stats()
    assert doc["warnings"] == []
    return doc, {t["name"]: t for t in doc["tasks"]}


def test_library_created_tasks_at_the_programs_line(spawned, fakelib):
    doc, tasks = spawned

    def site(obj):
        return None if obj is None else (obj["file"], obj["line"], obj["function"].rsplit(".", 1)[-1])

    def at(name):
        created = tasks[name]["created_at"]
        return site(created), site(created["via"])

    lib = fakelib.__file__
    # One library frame, and two (the innermost of them is "via"): the program's line.
    assert at("spawned") == ((__file__, line_of(spawner, "[USER_SPAWN]"), "spawner"),
                             (lib, fakelib.line("LIB_SPAWN"), "spawn"))
    assert at("deep") == ((__file__, line_of(spawner, "[USER_START_SOON]"), "spawner"),
                          (lib, fakelib.line("LIB_DEEP"), "_spawn"))
    # Made by the program itself: no via.
    assert at("direct") == ((__file__, line_of(spawner, "[USER_DIRECT]"), "spawner"), None)
    assert at("own_parent") == ((__file__, line_of(spawner, "[USER_OWN]"), "spawner"), None)
    # The library's own task made it: no line of the program within that step, so the
    # library's line, never the program's line further out (asyncio.run).
    assert at("own") == ((lib, fakelib.line("LIB_OWN"), "own_task"), None)
    assert tasks["own"]["parent"] == tasks["own_parent"]["id"]

    buf = io.StringIO()
    report.write(doc, format="text", file=buf, width=250, by="task")
    rows = {line.split()[1]: line for line in buf.getvalue().splitlines()
            if line.split()[1:2] and line.split()[1] in tasks}
    here = __file__.rsplit("/", 1)[-1]
    assert f" {here}:{line_of(spawner, '[USER_SPAWN]')} (via fakelib/__init__.py:{fakelib.line('LIB_SPAWN')}) " \
        in rows["spawned"], rows["spawned"]
    assert f" {here}:{line_of(spawner, '[USER_START_SOON]')} (via fakelib/__init__.py:{fakelib.line('LIB_DEEP')}) " \
        in rows["deep"], rows["deep"]
    assert f" {here}:{line_of(spawner, '[USER_DIRECT]')} " in rows["direct"] and "(via" not in rows["direct"]
    assert f" __init__.py:{fakelib.line('LIB_OWN')} " in rows["own"] and "(via" not in rows["own"]
