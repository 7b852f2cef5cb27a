"""Await chains through awaitables that are not async def coroutines, exactly.

grpc.aio's handler tasks run Cython coroutines, `ensure_future(awaitable)` wraps any
awaitable, and a class may implement the coroutine protocol itself. The wait inside
them is at a line of the program all the same: the chain is followed through the
object (a Cython coroutine's cr_await, the coroutine_wrapper of `coro.__await__()`, the
coroutine an object of a Python class drives) to that line.
"""
import asyncio
import collections.abc

import pytest

import aioprof
from test_fake_clock import MS, fake_clock, line_of, ns  # noqa: F401  (fake_clock: a fixture)

pytestmark = pytest.mark.sanitize


async def inner(ev):
    await ev.wait()  # [INNER]


class Delegating:
    """__await__ hands over an async def coroutine's own iterator."""

    def __init__(self, ev):
        self.ev = ev

    def __await__(self):
        return inner(self.ev).__await__()


class GeneratorAwait:
    """__await__ is a generator function that delegates with yield from."""

    def __init__(self, ev):
        self.ev = ev

    def __await__(self):
        return (yield from inner(self.ev).__await__())  # [GEN]


class Driver(collections.abc.Coroutine):
    """A coroutine class of its own, driving an async def coroutine it holds."""

    __slots__ = ()

    def __init__(self, coro):
        self._coro = coro

    def send(self, value):
        return self._coro.send(value)

    def throw(self, *exc):
        return self._coro.throw(*exc)

    def close(self):
        self._coro.close()

    def __await__(self):
        return self._coro.__await__()


class CustomCoroutine(Driver):
    """The coroutine it drives is in its instance dict."""


class SlotsCoroutine(Driver):
    """The coroutine it drives is a __slots__ member (no instance dict)."""

    __slots__ = ("_coro",)


async def outer(ev):
    await Delegating(ev)  # [OUTER]


async def main(adv):
    ev = asyncio.Event()
    tasks = [asyncio.ensure_future(Delegating(ev)), asyncio.ensure_future(GeneratorAwait(ev)),
             asyncio.ensure_future(CustomCoroutine(inner(ev))), asyncio.ensure_future(SlotsCoroutine(inner(ev))),
             asyncio.ensure_future(outer(ev))]
    for t, name in zip(tasks, ["delegating", "generator", "custom", "slots", "outer"]):
        t.set_name(name)
    await asyncio.sleep(0)   # every task runs to its wait
    adv(5 * MS)
    ev.set()
    await asyncio.gather(*tasks)


def test_waits_inside_other_awaitables_are_at_the_programs_line(fake_clock):
    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        asyncio.run(main(fake_clock))
    doc = p.stats()
    assert doc["warnings"] == []
    tasks = {t["name"]: t for t in doc["tasks"]}
    at_inner, at_gen, at_outer = (line_of(inner, "[INNER]"), line_of(GeneratorAwait.__await__, "[GEN]"),
                                  line_of(outer, "[OUTER]"))
    chains = {"delegating": [at_inner], "generator": [at_gen, at_inner], "custom": [at_inner],
              "slots": [at_inner], "outer": [at_outer, at_inner]}
    for name, chain in chains.items():
        t = tasks[name]
        (site,) = t["await_sites"]
        assert (site["line"], site["count"], ns(site["idle_s"])) == (at_inner, 1, 5 * MS), (name, site)
        assert [c["line"] for c in site["chain"]] == chain, name
        assert site["file"] == __file__ and ns(t["idle_s"]) == 5 * MS
    inner_site = next(s for s in doc["sites"] if s["file"] == __file__ and s["line"] == at_inner)
    assert (inner_site["innermost_count"], ns(inner_site["innermost_idle_s"])) == (5, 25 * MS)
