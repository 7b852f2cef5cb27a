# The seed tool's use: the report taken from inside main while it runs, with tasks still
# pending; and max_tasks: 30 short tasks, at most 10 records kept, all of them counted.
import json
import time
import asyncio
import aioprof


async def short(n):
    await asyncio.sleep_ms(1)
    return n


async def forever():
    await asyncio.sleep(60)


async def main():
    t = time.ticks_us()
    f = asyncio.create_task(forever())
    await asyncio.gather(*[short(n) for n in range(30)])
    await asyncio.sleep_ms(20)
    own = time.ticks_diff(time.ticks_us(), t)
    doc = p.stats()   # while main's third step runs and forever() sleeps
    f.cancel()
    return own, doc


p = aioprof.Profiler(max_tasks=10).start()
own_us, doc = asyncio.run(main())
p.stop()
print(json.dumps({"main_us": own_us}))
print(json.dumps(doc))
print(json.dumps(p.stats()))
