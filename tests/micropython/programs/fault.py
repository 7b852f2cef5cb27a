# A fault inside the profiler stops profiling with one warning; the program goes on.
import asyncio
import aioprof


async def work(n):
    for _ in range(n):
        await asyncio.sleep_ms(1)
    return n


async def main():
    await work(2)
    p._live = None   # break the profiler's own table: its next step start faults
    print("results", await asyncio.gather(work(3), work(4)))

p = aioprof.Profiler().start()
asyncio.run(main())
print("running", p.running)
p.stop()
print("warnings", p.stats()["warnings"])
