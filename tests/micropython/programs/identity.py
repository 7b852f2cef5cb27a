# asyncio's behaviour, which must be the same with and without the profiler: the test runs
# this twice (argv[1] "on": profiled, with the document written to argv[2]; "off": not)
# and compares stdout, stderr and the exit status.
import sys
import asyncio
import _asyncio
import aioprof

PROFILE = sys.argv[1] == "on"
p = aioprof.Profiler() if PROFILE else None
if p:
    p.start()


async def value(x, ms=0):
    await asyncio.sleep_ms(ms)
    return x


async def boom(ms=0):
    await asyncio.sleep_ms(ms)
    raise ValueError("boom %d" % ms)


async def sleeper(log):
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        log.append("sleeper cancelled")
        raise


async def main():
    print("gather", await asyncio.gather(value(1, 5), value(2), value(3, 1)))
    try:
        await asyncio.gather(value(1, 5), boom(1))
    except ValueError as e:
        print("gather raised", repr(e))
    results = await asyncio.gather(value(1), boom(2), return_exceptions=True)
    print("gather return_exceptions", [repr(r) for r in results])
    print("wait_for", await asyncio.wait_for(value("w", 1), 1))
    try:
        await asyncio.wait_for(value("late", 200), 0.01)
    except asyncio.TimeoutError:
        print("wait_for timed out")
    print("wait_for_ms", await asyncio.wait_for_ms(value("m", 1), 1000))
    try:
        await asyncio.wait_for_ms(value("late", 200), 5)
    except asyncio.TimeoutError:
        print("wait_for_ms timed out")
    try:
        await asyncio.wait_for(boom(1), 1)
    except ValueError as e:
        print("wait_for raised", repr(e))

    coro = value("t")
    t = asyncio.create_task(coro)
    print("isinstance", isinstance(t, asyncio.Task), type(t) is asyncio.Task, asyncio.Task is _asyncio.Task,
          t.coro is coro, t.done())
    print("task result", await t, t.done())

    log = []
    s = asyncio.create_task(sleeper(log))
    await asyncio.sleep_ms(2)
    print("cancel", s.cancel(), s.cancel() if s.done() else "pending")
    try:
        await s
    except asyncio.CancelledError:
        print("awaited cancelled task", log, s.done())
    g = asyncio.create_task(asyncio.gather(sleeper(log), sleeper(log)))
    await asyncio.sleep_ms(2)
    g.cancel()
    try:
        await g
    except asyncio.CancelledError:
        print("gather cancelled", log)
    never = asyncio.create_task(value("never"))
    never.cancel()
    try:
        await never
    except asyncio.CancelledError:
        print("cancelled before its first step")

    try:
        await boom(3)
    except ValueError as e:
        print("caught", repr(e))
    asyncio.create_task(boom(4))   # nobody awaits it: the loop's exception handler reports it
    await asyncio.sleep_ms(10)
    try:
        asyncio.current_task().cancel()
    except RuntimeError as e:
        print("cancel self:", e)
    return "main done"


print(asyncio.run(main()))
loop = asyncio.get_event_loop()
print("loop.run_until_complete", loop.run_until_complete(value("ruc", 1)))
print("run_until_complete(task)", asyncio.run_until_complete(asyncio.create_task(value("core", 1))))
if p:
    p.stop()
    with open(sys.argv[2], "w") as f:
        p.report("json", f)


async def fail():
    await asyncio.sleep_ms(1)
    raise KeyError("uncaught")

if p:
    p.start()
asyncio.run(fail())
