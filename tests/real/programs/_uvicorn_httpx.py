"""The driver of the ASGI programs (FastAPI, Django): serve `app` with uvicorn in this
process and GET /work/0 ... /work/<n-1> from it, one after the other, with an httpx client
on the same loop; each response's status and JSON to stdout, each round trip timed in
`costs`; then wait for the tasks in `spawned`, stop the server and write the figures."""
import asyncio
import socket

import httpx
import uvicorn


async def serve_and_get(app, costs, n, spawned):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for i in range(n):
            with costs.roundtrip(i):
                r = await client.get(f"/work/{i}")
            print(r.status_code, r.json())
    await asyncio.gather(*spawned)
    server.should_exit = True
    await serving
    costs.write()
