"""The programs' own measurements (perf_counter), written as JSON for tests/real/_real.py.

    costs = Costs(SLEEP)
    with costs.wait(): await asyncio.sleep(SLEEP)  # [IDLE]     in the handler
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    costs.handled()                                             # one request's figures done
    with costs.roundtrip(i): ...                                # the client's request i
    costs.write()                                               # to the file argv[1]
"""
import contextlib
import json
import sys
import time


class Costs:
    def __init__(self, sleep_s):
        self.sleep_s = sleep_s
        self.requests = []
        self._current = {}

    @contextlib.contextmanager
    def _timed(self, key, into=None):
        t = time.perf_counter()
        yield
        (self._current if into is None else into)[key] = time.perf_counter() - t

    def wait(self):
        return self._timed("await_s")

    def block(self):
        return self._timed("blocked_s")

    def handled(self):
        self.requests.append(self._current)
        self._current = {}

    @contextlib.contextmanager
    def roundtrip(self, i):
        t = time.perf_counter()
        yield
        self.requests[i]["roundtrip_s"] = time.perf_counter() - t

    def write(self):
        with open(sys.argv[1], "w") as f:
            json.dump({"sleep_s": self.sleep_s, "requests": self.requests}, f)
