# The seed tool's own example as it was used: endless tasks, the profiler started by main
# and its report taken from inside main after 500 ms. Each task counts its own steps and
# busy time (ticks_us), read at the same moment as the profiler's figures.
import json
import time
import asyncio
import aioprof

steps = {"slow": 0, "quicker": 0}
busy = {"slow": 0, "quicker": 0}


async def endless(name, ms):
    while True:
        steps[name] += 1
        t = time.ticks_us()
        time.sleep_ms(ms)   # blocking, as the seed's example does
        busy[name] += time.ticks_diff(time.ticks_us(), t)
        await asyncio.sleep_ms(20)


async def quicker():
    await endless("quicker", 1)


async def slow():
    await endless("slow", 80)


async def main():
    p = aioprof.Profiler().start()
    asyncio.create_task(slow())
    asyncio.create_task(quicker())
    t = time.ticks_us()
    await asyncio.sleep_ms(500)
    slept = time.ticks_diff(time.ticks_us(), t)
    doc = p.stats()
    print(json.dumps({"steps": steps, "busy_us": busy, "slept_us": slept}))
    print(json.dumps(doc))
    p.stop()


asyncio.run(main())
