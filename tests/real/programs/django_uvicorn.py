"""Django's ASGI application (an async view) under uvicorn, in this process, driven by an
httpx client on the same loop.

Each of 3 sequential GET /work/<i> requests: the view awaits asyncio.sleep(SLEEP) at
[IDLE], blocks in time.sleep(BLOCK) at [BLOCK] and starts a task at [SPAWN]. Django is
configured here (no settings module, no database, no middleware). The program's own
measurements go to the JSON file argv[1]; stdout gets the responses only.
"""
import asyncio
import time

import django
from django.conf import settings
from django.http import JsonResponse
from django.urls import path
from _costs import Costs
from _uvicorn_httpx import serve_and_get

SLEEP, BLOCK, N = 0.2, 0.05, 3
costs = Costs(SLEEP)
spawned = []


async def note(i):
    await asyncio.sleep(0)


async def work(request, i):
    with costs.wait(): await asyncio.sleep(SLEEP)  # [IDLE]
    with costs.block(): time.sleep(BLOCK)  # [BLOCK]
    spawned.append(asyncio.ensure_future(note(i)))  # [SPAWN]
    costs.handled()
    return JsonResponse({"i": i, "ok": True})


urlpatterns = [path("work/<int:i>", work)]
settings.configure(DEBUG=False, ALLOWED_HOSTS=["127.0.0.1"], ROOT_URLCONF=__name__,
                   MIDDLEWARE=[], INSTALLED_APPS=[], DATABASES={}, USE_TZ=True)
django.setup()
from django.core.asgi import get_asgi_application  # noqa: E402  (after settings)

app = get_asgi_application()
asyncio.run(serve_and_get(app, costs, N, spawned))
