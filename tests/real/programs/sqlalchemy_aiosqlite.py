"""SQLAlchemy's asyncio mode on aiosqlite: 3 jobs, each a task created at [SPAWN], run one
after the other. Each job runs a query that waits SLEEP seconds in SQLite (a registered
function, in aiosqlite's thread) at [IDLE], then blocks in time.sleep(BLOCK) at [BLOCK].
Measurements go to argv[1]; stdout gets the query results only.
"""
import asyncio
import time

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import create_async_engine
from _costs import Costs

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)


def sleep_ms(ms):
    time.sleep(ms / 1000)
    return ms


async def job(engine, i):
    async with engine.connect() as conn:
        with costs.wait(): r = await conn.execute(text(f"select sleep_ms({SLEEP * 1000:g}) + {i}"))  # [IDLE]
        with costs.block(): time.sleep(BLOCK)  # [BLOCK]
        costs.handled()
        return r.scalar()


async def main():
    engine = create_async_engine("sqlite+aiosqlite:///:memory:")

    @event.listens_for(engine.sync_engine, "connect")
    def _register(dbapi_conn, record):
        dbapi_conn.create_function("sleep_ms", 1, sleep_ms)

    async with engine.connect() as conn:   # connect once, before the measured jobs
        await conn.execute(text("select 1"))
    for i in range(N):
        with costs.roundtrip(i):
            value = await asyncio.create_task(job(engine, i))  # [SPAWN]
        print("job", i, value)
    await engine.dispose()
    costs.write()


asyncio.run(main())
