# The profiler's overhead on a sleep(0) storm: TASKS tasks each doing STEPS `await
# asyncio.sleep(0)`, timed (ticks_us) without and with the profiler, REPS times each,
# alternately; prints the best of each and the cost per task step.
#   tools/micropython micropython/bench.py [TASKS STEPS REPS]
import sys
import time
import asyncio
import aioprof

args = [int(a) for a in sys.argv[1:]] or [10, 2000, 5]
TASKS, STEPS, REPS = args


async def storm():
    for _ in range(STEPS):
        await asyncio.sleep(0)


async def main():
    await asyncio.gather(*[storm() for _ in range(TASKS)])


def timed(profile):
    p = aioprof.Profiler() if profile else None
    if p:
        p.start()
    t = time.ticks_us()
    asyncio.run(main())
    dt = time.ticks_diff(time.ticks_us(), t)
    if p:
        p.stop()
        assert sum(r["steps"] for r in p.stats()["tasks"] if r["coroutine"] == "storm") == TASKS * (STEPS + 1)
    return dt


best = {False: None, True: None}
for _ in range(REPS):
    for profile in (False, True):
        dt = timed(profile)
        if best[profile] is None or dt < best[profile]:
            best[profile] = dt
steps = TASKS * (STEPS + 1)
off, on = best[False], best[True]
print("%d task steps: %.1f ms without the profiler, %.1f ms with it: %.2f us a step without, "
      "%.2f us with (+%.2f us, +%.0f%%)" % (steps, off / 1e3, on / 1e3, off / steps, on / steps,
                                           (on - off) / steps, 100.0 * (on - off) / off))
