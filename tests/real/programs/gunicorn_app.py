"""An aiohttp application for gunicorn's aiohttp worker (tests/real/test_gunicorn_metrics.py).

GET /work: awaits asyncio.sleep(SLEEP) at [IDLE], blocks in time.sleep(BLOCK) at [BLOCK],
and answers with the worker's pid and what it measured itself (perf_counter).
"""
import asyncio
import os
import time

from aiohttp import web

SLEEP, BLOCK = 0.02, 0.02


async def work(request):
    t = time.perf_counter()
    await asyncio.sleep(SLEEP)  # [IDLE]
    waited = time.perf_counter() - t
    t = time.perf_counter()
    time.sleep(BLOCK)  # [BLOCK]
    return web.json_response({"pid": os.getpid(), "await_s": waited, "blocked_s": time.perf_counter() - t})


app = web.Application()
app.router.add_get("/work", work)
