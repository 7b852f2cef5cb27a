"""A websockets server and client in one process: 3 connections, one message each.

The server's handler awaits asyncio.sleep(SLEEP) at [IDLE], blocks in time.sleep(BLOCK) at
[BLOCK], starts a task at [SPAWN] and answers. Measurements go to argv[1]; stdout gets
the answers only.
"""
import asyncio
import time

from websockets.asyncio.client import connect
from websockets.asyncio.server import serve
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)
spawned = []


async def note(i):
    await asyncio.sleep(0)


async def handler(ws):
    msg = await ws.recv()
    with costs.wait(): await asyncio.sleep(SLEEP)  # [IDLE]
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    spawned.append(asyncio.create_task(note(msg)))  # [SPAWN]
    costs.handled()
    await ws.send(f"done {msg}")


async def main():
    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        for i in range(N):
            # the round trip holds the whole connection: the server's task for it (opening
            # and closing handshakes included) runs within it
            with costs.roundtrip(i):
                async with connect(f"ws://127.0.0.1:{port}") as ws:
                    await ws.send(str(i))
                    print(await ws.recv())
        await asyncio.gather(*spawned)
    costs.write()


asyncio.run(main())
