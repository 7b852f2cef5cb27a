"""FastAPI under uvicorn (in this process), driven by an httpx client on the same loop.

Each of 3 sequential GET /work requests: the handler awaits asyncio.sleep(SLEEP) at [IDLE],
then blocks in time.sleep(BLOCK) at [BLOCK], and starts a background task at [SPAWN].
The program measures each interval itself (perf_counter) and writes the figures to the
JSON file named by argv[1]; stdout gets the responses only.
"""
import asyncio
import socket
import time

import httpx
import uvicorn
from fastapi import FastAPI
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
app = FastAPI()
costs = Costs(SLEEP)
spawned = []


async def note(i):
    await asyncio.sleep(0)


@app.get("/work/{i}")
async def work(i: int):
    with costs.wait(): await asyncio.sleep(SLEEP)  # [IDLE]
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    spawned.append(asyncio.ensure_future(note(i)))  # [SPAWN]
    costs.handled()
    return {"i": i, "ok": True}


async def main():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))  # [SERVE]
    while not server.started:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for i in range(N):
            with costs.roundtrip(i):
                r = await client.get(f"/work/{i}")
            print(r.status_code, r.json())
    await asyncio.gather(*spawned)
    server.should_exit = True
    await serving
    costs.write()


asyncio.run(main())
