# Many instances of one class, each running the same method as a task: labels tell them
# apart. Sensor 2 misbehaves (blocks 30 ms a step). Prints its own measure of each
# sensor's blocking (ticks_us), then the profiler's document.
import json
import time
import asyncio
import aioprof

STEPS = 4


class Sensor:
    def __init__(self, n, block_ms):
        self.n, self.block_ms, self.busy_us = n, block_ms, 0

    async def run(self):
        for _ in range(STEPS):
            t = time.ticks_us()
            time.sleep_ms(self.block_ms)
            self.busy_us += time.ticks_diff(time.ticks_us(), t)
            await asyncio.sleep_ms(5)


async def main(sensors):
    tasks = [asyncio.create_task(s.run()) for s in sensors]
    aioprof.label(tasks[0], sensors[0])          # by the object: "Sensor@<id>"
    for t, s in zip(tasks[1:], sensors[1:]):
        aioprof.label(t, "sensor %d" % s.n)
    await asyncio.gather(*tasks)


sensors = [Sensor(0, 1), Sensor(1, 1), Sensor(2, 30), Sensor(3, 1)]
with aioprof.Profiler() as p:
    asyncio.run(main(sensors))
print(json.dumps({"busy_us": [s.busy_us for s in sensors], "object_label": "Sensor@%x" % id(sensors[0])}))
print(json.dumps(p.stats()))
