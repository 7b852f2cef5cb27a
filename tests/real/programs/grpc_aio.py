"""A grpc.aio server and client in one process: 3 sequential unary calls (raw bytes, no
protobuf). grpc.aio runs each call's handler in a task of its own whose coroutine is
Cython's, made by grpc's compiled server loop (no line of the program made it: [RUN] is
the asyncio.run line, which made only main's task).

The handler awaits asyncio.sleep(SLEEP) at [IDLE], blocks in time.sleep(BLOCK) at [BLOCK]
and starts a task at [SPAWN]. The program's own measurements go to the JSON file argv[1];
stdout gets the answers only.
"""
import asyncio
import time

import grpc
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)
spawned = []


async def note(i):
    await asyncio.sleep(0)


async def work(request, context):
    with costs.wait(): await asyncio.sleep(SLEEP)  # [IDLE]
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    spawned.append(asyncio.create_task(note(request)))  # [SPAWN]
    costs.handled()
    return b"done " + request


async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "real.Work", {"Do": grpc.unary_unary_rpc_method_handler(work)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        do = channel.unary_unary("/real.Work/Do")
        await channel.channel_ready()
        for i in range(N):
            with costs.roundtrip(i):
                answer = await do(str(i).encode())
            print(answer.decode())
    await asyncio.gather(*spawned)
    await server.stop(None)
    costs.write()


asyncio.run(main())  # [RUN]
