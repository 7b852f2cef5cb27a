"""asyncpg on a real PostgreSQL (its Unix socket directory in REAL_PGHOST): 3 jobs, each a
task created at [SPAWN], one after the other; each takes a pool connection and runs
`select pg_sleep(SLEEP)` at [IDLE], then blocks in time.sleep(BLOCK) at [BLOCK].
Measurements go to argv[1]; stdout gets the query results only.
"""
import asyncio
import os
import time

import asyncpg
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)


async def job(pool, i):
    async with pool.acquire() as conn:
        with costs.wait(): value = await conn.fetchval(f"select {i} from pg_sleep({SLEEP})")  # [IDLE]
        with costs.block(): time.sleep(BLOCK)  # [BLOCK]
        costs.handled()
        return value


async def main():
    pool = await asyncpg.create_pool(host=os.environ["REAL_PGHOST"], user="postgres",
                                     database="postgres", min_size=1, max_size=1)
    for i in range(N):
        with costs.roundtrip(i):
            value = await asyncio.create_task(job(pool, i))  # [SPAWN]
        print("job", i, value)
    await pool.close()
    costs.write()


asyncio.run(main())
