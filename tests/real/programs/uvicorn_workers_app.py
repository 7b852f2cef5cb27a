"""A plain ASGI application for `uvicorn --workers 2` under aioprof --subprocesses
(tests/real/test_uvicorn_workers.py).

Each request: spins SPIN seconds on the loop (measured with perf_counter) and answers with
the worker's pid and what it measured itself.
"""
import json
import os
import time

SPIN = 0.01


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    t = time.perf_counter()
    while time.perf_counter() - t < SPIN:
        pass
    spun = time.perf_counter() - t
    body = json.dumps({"pid": os.getpid(), "spun_s": spun}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
