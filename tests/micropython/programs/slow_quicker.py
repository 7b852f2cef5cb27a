# The seed's example (shared case 01) under MicroPython: "slow" blocks the loop 80 ms then
# sleeps 20 ms, "quicker" blocks 1 ms then sleeps 20 ms, N times each, gathered by main.
# Prints what the program measured itself (ticks_us), then the profiler's document (and
# with -v its text report).
import json
import sys
import time
import asyncio
import aioprof

N = 5
busy = {"slow": 0, "quicker": 0}
wait = {"slow": 0, "quicker": 0}
first = {}


async def worker(name, ms):
    # One clock reading ends each interval and starts the next: the coroutine's life, from
    # its start to its end, is busy (running) + wait (inside the await), exactly.
    t = first[name] = time.ticks_us()
    for _ in range(N):
        time.sleep_ms(ms)   # blocking: the loop can run nothing else meanwhile
        t2 = time.ticks_us()
        busy[name] += time.ticks_diff(t2, t)
        await asyncio.sleep_ms(20)
        t = time.ticks_us()
        wait[name] += time.ticks_diff(t, t2)


async def quicker():
    await worker("quicker", 1)


async def slow():
    await worker("slow", 80)


async def main():
    global t0
    t0 = time.ticks_us()
    await asyncio.gather(slow(), quicker())
    return time.ticks_diff(time.ticks_us(), t0)


p = aioprof.Profiler().start()
total = asyncio.run(main())
p.stop()
own = {"busy_us": busy, "wait_us": wait, "main_us": total,
       "first_late_us": {k: time.ticks_diff(first[k], t0) for k in first}}
print(json.dumps(own))
print(json.dumps(p.stats()))
if "-v" in sys.argv:
    p.report(file=sys.stdout)
