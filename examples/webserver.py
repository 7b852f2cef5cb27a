"""A small aiohttp service and the load that hits it, in one process.

The program starts an aiohttp web application on 127.0.0.1, then runs N client
tasks (default 20) that send a seeded, weighted mix of requests to it for a few
seconds (default 3), then shuts everything down and prints requests, errors and
p50/p99 latency per endpoint. It needs aiohttp >= 3.9 and nothing else; it does
not know it may be profiled.

    python3 examples/webserver.py [--seconds 3] [--clients 20] [--port 0] [--seed 1]
    python3 -m aioprof examples/webserver.py

The endpoints cost very different things, so a profiler has something to find:

  /health      trivial JSON; almost no time anywhere.
  /items/{id}  awaits a fake database round trip (db layer: fetch_item -> _round_trip
               -> asyncio.sleep(0.005)); mostly idle, awaiting inside fetch_item.
  /search      fans out three sub-queries with asyncio.gather (2, 4 and 8 ms sleeps),
               so each request creates three child tasks; idle ~8 ms.
  /report      ~2 ms of pure-Python statistics on the loop: busy (CPU) time, and
               every other task waits "scheduled" while it runs.
  /legacy      calls the blocking time.sleep(0.02) (a sync client left in async
               code): 20 ms busy steps with no CPU, blocking the whole loop. Rare in
               the mix, but it should top the slow-step list.

A background task ("cache_refresher", PopularCache.refresh_forever) lives for the
whole run, waking every 0.25 s to refresh a cache through the same db layer; the 20
client tasks ("client-N") live for the whole load phase.
Exit status: 0, or 1 if any request failed.
"""

import argparse
import asyncio
import random
import sys
import time
from collections import Counter, defaultdict

import aiohttp
from aiohttp import web

# Request mix: (endpoint, weight). Roughly 1 in 94 requests goes to /legacy.
MIX = [("/health", 30), ("/items", 35), ("/search", 15), ("/report", 12), ("/legacy", 1)]
N_ITEMS = 1000
REPORT_SAMPLES = 6_000


# --- db layer: a stand-in for an async database driver ---------------------------

async def _round_trip(seconds):
    """One network round trip to the database server."""
    await asyncio.sleep(seconds)


async def fetch_item(item_id):
    await _round_trip(0.005)
    if not 1 <= item_id <= N_ITEMS:
        return None
    return {"id": item_id, "name": f"item-{item_id}", "price": round(item_id * 0.37, 2)}


async def search_titles(term):
    await _round_trip(0.002)
    return [f"title:{term}:{i}" for i in range(3)]


async def search_tags(term):
    await _round_trip(0.004)
    return [f"tag:{term}"]


async def search_authors(term):
    await _round_trip(0.008)
    return [f"author:{term}:{i}" for i in range(2)]


# --- the web application ---------------------------------------------------------

def compute_stats(samples):
    """Pure-Python statistics: deliberately CPU-bound, runs on the event loop."""
    n = len(samples)
    total = 0.0
    for x in samples:
        total += x
    mean = total / n
    lo, hi = min(samples), max(samples)
    width = (hi - lo) / 20 or 1.0
    var = 0.0
    hist = [0] * 20
    for x in samples:
        d = x - mean
        var += d * d
        hist[min(int((x - lo) / width), 19)] += 1
    ordered = sorted(samples)
    return {"n": n, "mean": mean, "stdev": (var / n) ** 0.5, "hist": hist,
            "p50": ordered[n // 2], "p99": ordered[int(n * 0.99)]}


async def health(request):
    return web.json_response({"status": "ok"})


async def get_item(request):
    item = await fetch_item(int(request.match_info["id"]))
    if item is None:
        raise web.HTTPNotFound()
    return web.json_response(item)


async def search(request):
    term = request.query.get("q", "")
    titles, tags, authors = await asyncio.gather(
        search_titles(term), search_tags(term), search_authors(term))
    return web.json_response({"q": term, "titles": titles, "tags": tags, "authors": authors})


async def report(request):
    return web.json_response(compute_stats(request.app[SAMPLES]))


async def legacy(request):
    time.sleep(0.02)  # BUG (on purpose): a blocking call inside a coroutine.
    return web.json_response({"legacy": True})


class PopularCache:
    """The 'popular items' cache, kept fresh by a background task."""

    def __init__(self):
        self.items = []
        self.refreshes = 0

    async def refresh_forever(self):
        while True:
            await asyncio.sleep(0.25)
            self.items = [await fetch_item(i) for i in (1, 2, 3)]
            self.refreshes += 1


SAMPLES = web.AppKey("samples", list)
CACHE = web.AppKey("cache", PopularCache)


def make_app(seed):
    app = web.Application()
    rng = random.Random(seed)
    app[SAMPLES] = [rng.gauss(100.0, 15.0) for _ in range(REPORT_SAMPLES)]
    app[CACHE] = PopularCache()
    app.router.add_get("/health", health)
    app.router.add_get("/items/{id}", get_item)
    app.router.add_get("/search", search)
    app.router.add_get("/report", report)
    app.router.add_get("/legacy", legacy)
    return app


# --- the load client -------------------------------------------------------------

async def client(session, base, rng, deadline, latencies, errors):
    """One user: send weighted random requests until the deadline."""
    loop = asyncio.get_running_loop()
    names = [name for name, _ in MIX]
    weights = [w for _, w in MIX]
    while loop.time() < deadline:
        endpoint = rng.choices(names, weights)[0]
        if endpoint == "/items":
            url = f"{base}/items/{rng.randint(1, N_ITEMS)}"
        elif endpoint == "/search":
            url = f"{base}/search?q={rng.choice(['asyncio', 'loop', 'task', 'await'])}"
        else:
            url = base + endpoint
        start = time.perf_counter()
        ok = False
        try:
            async with session.get(url) as resp:
                await resp.read()
                ok = resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass
        if ok:
            latencies[endpoint].append(time.perf_counter() - start)
        else:
            errors[endpoint] += 1


def percentile_ms(ordered, q):
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


async def main(args):
    app = make_app(args.seed)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = runner.addresses[0][1]
    base = f"http://127.0.0.1:{port}"
    refresher = asyncio.create_task(app[CACHE].refresh_forever(),
                                    name="cache_refresher")

    latencies = defaultdict(list)  # endpoint -> seconds of each successful request
    errors = Counter()             # endpoint -> failed requests
    started = time.perf_counter()
    try:
        connector = aiohttp.TCPConnector(limit=args.clients)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            deadline = asyncio.get_running_loop().time() + args.seconds
            tasks = [asyncio.create_task(
                         client(session, base, random.Random(args.seed * 1000 + i),
                                deadline, latencies, errors),
                         name=f"client-{i}")
                     for i in range(args.clients)]
            await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    finally:
        refresher.cancel()
        try:
            await refresher
        except asyncio.CancelledError:
            pass
        await runner.cleanup()

    total = sum(len(v) for v in latencies.values()) + sum(errors.values())
    print(f"webserver: {args.clients} clients, {elapsed:.2f} s, {total} requests "
          f"({total / elapsed:.0f} req/s), {sum(errors.values())} errors, "
          f"{app[CACHE].refreshes} cache refreshes")
    print(f"{'endpoint':<10} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for name, _ in MIX:
        ordered = sorted(latencies[name])
        print(f"{name:<10} {len(ordered) + errors[name]:>8} {errors[name]:>6} "
              f"{percentile_ms(ordered, 0.50):>8.1f} {percentile_ms(ordered, 0.99):>8.1f}")
    return 1 if sum(errors.values()) else 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="load duration (default 3)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients (default 20)")
    parser.add_argument("--port", type=int, default=0, help="server port; 0 = any free port")
    parser.add_argument("--seed", type=int, default=1, help="seed of the request mix")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
