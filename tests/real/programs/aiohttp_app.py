"""An aiohttp server and client in one process (REAL_LOOP=uvloop: on uvloop's loop).

3 sequential GET /work requests; the handler awaits asyncio.sleep(SLEEP) at [IDLE], blocks
in time.sleep(BLOCK) at [BLOCK] and starts a task at [SPAWN]. The program's own
measurements go to the JSON file argv[1]; stdout gets the responses only. With REAL_HOLD=1
(tests/real/test_prometheus.py) it writes them and prints "served" once its handlers are
done, then serves on until its stdin closes.
"""
import asyncio
import os
import sys
import time

from aiohttp import ClientSession, web
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)
spawned = []


async def note(i):
    await asyncio.sleep(0)


async def work(request):
    with costs.wait(): await asyncio.sleep(SLEEP)  # [IDLE]
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    spawned.append(asyncio.create_task(note(request.match_info["i"])))  # [SPAWN]
    costs.handled()
    return web.json_response({"i": int(request.match_info["i"]), "ok": True})


async def main():
    app = web.Application()
    app.router.add_get("/work/{i}", work)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    async with ClientSession() as client:
        for i in range(N):
            with costs.roundtrip(i):
                async with client.get(f"http://127.0.0.1:{port}/work/{i}") as r:
                    body = await r.json()
            print(r.status, body)
    await asyncio.gather(*spawned)
    if os.environ.get("REAL_HOLD"):   # tests/real/test_prometheus.py: serve on, figures final
        costs.write()
        print("served", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)   # until EOF
    await runner.cleanup()
    costs.write()


if os.environ.get("REAL_LOOP") == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
