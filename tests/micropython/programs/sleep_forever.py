# Waits in asyncio until interrupted (argv[1] "on": profiled); says "ready" first.
import sys
import asyncio
import aioprof

if sys.argv[1] == "on":
    aioprof.Profiler().start()


async def main():
    print("ready")
    await asyncio.sleep(60)

asyncio.run(main())
