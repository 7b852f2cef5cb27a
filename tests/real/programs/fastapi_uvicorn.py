"""FastAPI under uvicorn (in this process), driven by an httpx client on the same loop.

Each of 3 sequential GET /work requests: the handler awaits asyncio.sleep(SLEEP) at [IDLE],
then blocks in time.sleep(BLOCK) at [BLOCK], and starts a background task at [SPAWN].
The program measures each interval itself (perf_counter) and writes the figures to the
JSON file named by argv[1]; stdout gets the responses only.
"""
import asyncio
import time

from fastapi import FastAPI
from _costs import Costs
from _uvicorn_httpx import serve_and_get

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


asyncio.run(serve_and_get(app, costs, N, spawned))
