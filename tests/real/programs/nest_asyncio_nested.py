"""nest_asyncio: the main task runs 3 jobs one after the other, each in a nested
`loop.run_until_complete` at [SPAWN] (which wraps it in a task); each job awaits
asyncio.sleep(SLEEP) at [IDLE], then blocks in time.sleep(BLOCK) at [BLOCK].
Measurements go to argv[1]; stdout gets the results only.
"""
import asyncio
import time

import nest_asyncio
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)


async def job(i):
    with costs.wait(): await asyncio.sleep(SLEEP)  # [IDLE]
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    costs.handled()
    return i


async def main():
    loop = asyncio.get_running_loop()
    for i in range(N):
        with costs.roundtrip(i):
            value = loop.run_until_complete(job(i))  # [SPAWN]
        print("job", value)
    costs.write()


nest_asyncio.apply()
asyncio.run(main())
