"""Benchmark workloads for aioprof.

Each workload is a function ``run()`` that does its work inside its own
``asyncio.run(...)`` and returns nothing. They are sized so that an unprofiled run
takes about 0.3-1.0 s on a 2-core machine (see docs/performance.md).

  switch   W1: 1,000 tasks x 200 ``await asyncio.sleep(0)`` (a task-switch storm)
  chain    W2: 200 tasks x 400 iterations, each awaiting a 20-deep coroutine chain
               whose leaf does ``await asyncio.sleep(0)``
  echo     W3: asyncio-streams TCP echo server + 50 clients on 127.0.0.1, each sending
               ECHO_MESSAGES short lines and reading each reply
  mixed    W4: 200 tasks x 10 iterations of ~0.2 ms of pure-Python work then
               ``await asyncio.sleep(0)``
  aiohttp  W5: aiohttp server + client in one process, 3,000 GET requests
               (10 concurrent workers over one ClientSession); needs aiohttp

Stdlib only, except W5 which imports aiohttp (``prepare("aiohttp")`` imports it
outside the timed region).
"""
from __future__ import annotations

import asyncio

# ---------------------------------------------------------------- W1 switch
SWITCH_TASKS = 1000
SWITCH_YIELDS = 200


async def _switch_task() -> None:
    for _ in range(SWITCH_YIELDS):
        await asyncio.sleep(0)


async def _switch_main() -> None:
    await asyncio.gather(*[_switch_task() for _ in range(SWITCH_TASKS)])


def switch() -> None:
    """W1: 1,000 tasks x 200 ``await asyncio.sleep(0)``."""
    asyncio.run(_switch_main())


# ---------------------------------------------------------------- W2 chain
CHAIN_TASKS = 200
CHAIN_DEPTH = 20
CHAIN_ITERS = 400


async def _chain(n: int) -> int:
    if n == 0:
        await asyncio.sleep(0)
        return 0
    return await _chain(n - 1) + 1


async def _chain_task() -> None:
    for _ in range(CHAIN_ITERS):
        await _chain(CHAIN_DEPTH - 1)  # 20 coroutine frames including the leaf


async def _chain_main() -> None:
    await asyncio.gather(*[_chain_task() for _ in range(CHAIN_TASKS)])


def chain() -> None:
    """W2: 200 tasks x 400 iterations of a 20-deep ``await f(n-1)`` chain."""
    asyncio.run(_chain_main())


# ---------------------------------------------------------------- W3 echo
ECHO_CLIENTS = 50
ECHO_MESSAGES = 400
ECHO_PAYLOAD = b"hello aioprof, this is a short line\n"


async def _echo_handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            writer.write(line)
            await writer.drain()
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def _echo_client(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(ECHO_MESSAGES):
        writer.write(ECHO_PAYLOAD)
        await writer.drain()
        reply = await reader.readline()
        if reply != ECHO_PAYLOAD:
            raise RuntimeError(f"echo mismatch: {reply!r}")
    writer.close()
    await writer.wait_closed()


async def _echo_main() -> None:
    server = await asyncio.start_server(_echo_handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        await asyncio.gather(*[_echo_client(port) for _ in range(ECHO_CLIENTS)])


def echo() -> None:
    """W3: TCP echo over asyncio streams, 50 clients x ECHO_MESSAGES round trips."""
    asyncio.run(_echo_main())


# ---------------------------------------------------------------- W4 mixed
MIXED_TASKS = 200
MIXED_ITERS = 10
MIXED_WORK = 400  # units of _work_unit; ~0.2 ms in total on the reference machine


def _work_unit(i: int) -> int:
    acc = 0
    for j in range(8):
        acc += (i * j) % 7
    return acc


def _work(n: int) -> int:
    total = 0
    for i in range(n):
        total += _work_unit(i)
    return total


async def _mixed_task() -> None:
    for _ in range(MIXED_ITERS):
        _work(MIXED_WORK)
        await asyncio.sleep(0)


async def _mixed_main() -> None:
    await asyncio.gather(*[_mixed_task() for _ in range(MIXED_TASKS)])


def mixed() -> None:
    """W4: 200 tasks x 10 x (~0.2 ms of Python work, then ``sleep(0)``)."""
    asyncio.run(_mixed_main())


# ---------------------------------------------------------------- W5 aiohttp
AIOHTTP_REQUESTS = 3000
AIOHTTP_WORKERS = 10


async def _aiohttp_main() -> None:
    import aiohttp
    from aiohttp import web

    async def hello(request: "web.Request") -> "web.Response":
        return web.Response(text="hello, world")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/"
    per_worker = AIOHTTP_REQUESTS // AIOHTTP_WORKERS
    try:
        async with aiohttp.ClientSession() as session:
            async def worker() -> None:
                for _ in range(per_worker):
                    async with session.get(url) as resp:
                        body = await resp.text()
                        if resp.status != 200 or body != "hello, world":
                            raise RuntimeError(f"bad response {resp.status} {body!r}")

            await asyncio.gather(*[worker() for _ in range(AIOHTTP_WORKERS)])
    finally:
        await runner.cleanup()


def aiohttp_() -> None:
    """W5: aiohttp server and client in one process, 3,000 requests."""
    asyncio.run(_aiohttp_main())


# ---------------------------------------------------------------- registry
WORKLOADS = {
    "switch": switch,
    "chain": chain,
    "echo": echo,
    "mixed": mixed,
    "aiohttp": aiohttp_,
}

# Optional third-party modules each workload needs.
REQUIRES = {"aiohttp": ["aiohttp"]}

DESCRIPTIONS = {
    "switch": "W1: 1,000 tasks x 200 `await asyncio.sleep(0)`",
    "chain": "W2: 200 tasks x 400 awaits of a 20-deep coroutine chain ending in `sleep(0)`",
    "echo": f"W3: asyncio-streams TCP echo, 50 clients x {ECHO_MESSAGES} round trips on 127.0.0.1",
    "mixed": "W4: 200 tasks x 10 x (~0.2 ms of Python work + `sleep(0)`)",
    "aiohttp": f"W5: aiohttp server + client in one process, {AIOHTTP_REQUESTS:,} requests",
}


def prepare(name: str) -> None:
    """Import what workload `name` needs, so that the import is not timed.

    Raises ImportError if an optional dependency is missing.
    """
    import importlib

    for mod in REQUIRES.get(name, []):
        importlib.import_module(mod)
        if mod == "aiohttp":
            importlib.import_module("aiohttp.web")
