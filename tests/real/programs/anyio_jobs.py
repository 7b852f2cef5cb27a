"""anyio on asyncio: 3 jobs, each started with TaskGroup.start_soon at [SPAWN], one after
the other; each awaits anyio.sleep(SLEEP) at [IDLE], then blocks in time.sleep(BLOCK) at
[BLOCK]. Measurements go to argv[1]; stdout gets the results only.
"""
import time

import anyio
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)


async def job(i):
    with costs.wait(): await anyio.sleep(SLEEP)  # [IDLE]
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    costs.handled()
    print("job", i, "done")


async def main():
    for i in range(N):
        with costs.roundtrip(i):
            async with anyio.create_task_group() as tg:
                tg.start_soon(job, i)  # [SPAWN]
    costs.write()


anyio.run(main, backend="asyncio")
