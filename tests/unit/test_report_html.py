"""The HTML report's document (aioprof.report.html): the figures it embeds are the
report's, exactly (the fake clock of test_fake_clock.py); it loads nothing; no name can
break out of its data; and its size stays bounded for 10,000 tasks and worse.
The page itself, in a real browser: tests/integration/test_html.py.

Timeline (ms) of `two_jobs`: A runs 0-5 then waits at [WAIT] until B sets the event at 8
(scheduled 8-9), and runs 9-11; B is scheduled 0-5 and runs 5-9.
"""
import asyncio
import io
import json
import re

import aioprof
from aioprof.report import collapsed, html, text

from test_fake_clock import fake_clock, job, line_of, two_jobs  # noqa: F401 (fixture)

HOSTILE = "</script><img src=x onerror=alert(1)><!--"
# tasks rows: [id, name, coroutine, created at, parent, state, steps, busy, sched, idle,
# cpu, max, await site, internal]
BUSY, SCHED, IDLE, CPU = 7, 8, 9, 10


def profile(adv, **kw):
    with aioprof.Profiler(cpu_window_ms=1e-6, trace=True, async_stacks=True, **kw) as p:
        asyncio.run(two_jobs(adv))
    return p.stats()


def embedded(page):
    """The JSON of the page's data element, read as a browser would (up to the first
    "</script")."""
    m = re.search(r'<script type="application/json" id="aioprof-data">(.*?)</script', page, re.S)
    return json.loads(m.group(1))


def test_tables_flames_and_timeline_hold_the_exact_figures(fake_clock):
    doc = profile(fake_clock)
    data = embedded(html.render(doc))
    assert data == json.loads(json.dumps(html.page_data(doc)))
    rows = {r[1]: r for r in data["tasks"]["rows"]}
    assert [rows["A"][i] for i in (BUSY, SCHED, IDLE, CPU)] == [0.007, 0.001, 0.003, 0.0025]
    assert [rows["B"][i] for i in (BUSY, SCHED, IDLE, CPU)] == [0.004, 0.005, 0.0, 0.0015]
    wait = line_of(job, "# [WAIT]")
    assert rows["A"][12] == f"test_fake_clock.py:{wait}"
    (coro,) = [r for r in data["coroutines"]["rows"] if r[0] == "job"]
    assert coro[1:6] == [2, 3, 0.011, 0.006, 0.003]
    # the await flame: A's wait at [WAIT], 3 ms = 3000 µs, under the gather's 11 ms
    labels = [f[0] for f in data["frames"]]
    idle = {labels[s[0][-1]]: s[1] for s in data["flames"]["idle"]["stacks"]}
    assert idle[f"job (test_fake_clock.py:{wait})"] == 3000
    assert data["frames"][labels.index(f"job (test_fake_clock.py:{wait})")][1].endswith(
        f"test_fake_clock.py:{wait}")
    assert "sampling was off" in data["flames"]["cpu"]["missing"]
    # the timeline: a lane per task with its running/scheduled/awaiting intervals (µs)
    lanes = {lane[0]: lane for lane in data["timeline"]["lanes"]}
    strings = data["timeline"]["strings"]
    a = sorted((strings[e[3]], e[1], e[2]) for e in lanes["A job"][2])
    assert a == [(f"awaiting at test_fake_clock.py:{wait}", 5000, 3000), ("running", 0, 5000),
                 ("running", 9000, 2000), ("scheduled", 0, 0), ("scheduled", 8000, 1000)]
    assert sorted((strings[e[3]], e[1], e[2]) for e in lanes["B job"][2]) == [
        ("running", 5000, 4000), ("scheduled", 0, 5000)]
    assert lanes["loop 1"][1] == 1 and any(strings[e[3]].startswith("tick") for e in lanes["loop 1"][2])
    # the loop's busy time over the run, from the ticks less their select waits: 11 ms
    (chart,) = data["loops"]["charts"]
    assert chart["loop"] == 1 and len(chart["busy_us"]) == html.CHART_BINS
    assert abs(chart["bin_us"] * html.CHART_BINS - doc["wall_s"] * 1e6) < 0.5
    assert abs(sum(chart["busy_us"]) - 11000) <= 0.05 * html.CHART_BINS
    assert max(chart["busy_us"]) <= chart["bin_us"] + 0.05
    # the loops section is the text report's
    assert data["loops"]["lines"] == text._Renderer(
        doc, sort="busy", limit=0, show_internal=False, width=text.FULL_WIDTH,
        ellipsis="\u2026").loops()[1:]
    assert data["loops"]["cards"][0]["figures"][0] == ["utilization", text._pct(doc["loops"][0]["utilization"])]


def test_parts_not_recorded_say_so(fake_clock):
    with aioprof.Profiler(cpu_window_ms=1e-6) as p:
        asyncio.run(two_jobs(fake_clock))
    out = io.StringIO()
    p.report("html", out)
    assert out.getvalue() == html.render(p.stats())
    data = embedded(out.getvalue())
    assert "--trace" in data["timeline"]["missing"]
    assert "async stacks were off" in data["flames"]["idle"]["missing"]
    assert len(data["tasks"]["rows"]) == 5


def test_no_name_breaks_out_of_the_data(fake_clock):
    doc = profile(fake_clock)
    for task in doc["tasks"]:
        task["name"] = HOSTILE + task["name"]
    for row in doc["coroutines"]:
        row["coroutine"] = HOSTILE + "\u2028" + row["coroutine"]
    doc["frames"].append({"kind": "code", "file": HOSTILE, "line": 1, "function": HOSTILE})
    page = html.render(doc)
    assert "<img" not in page and "<!--" not in page
    assert len(re.findall("</script", page, re.I)) == 2   # the data's and the script's own
    data = embedded(page)
    assert {r[1] for r in data["tasks"]["rows"]} == {t["name"] for t in doc["tasks"]}
    assert any(r[0] == HOSTILE + "\u2028job" for r in data["coroutines"]["rows"])
    assert data["frames"][-1] == [collapsed.frame_text(doc["frames"][-1]), f"{HOSTILE}:1"]


def test_the_page_names_no_url_and_forbids_requests(fake_clock):
    page = html.render(profile(fake_clock))
    assert ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            'script-src \'unsafe-inline\'; style-src \'unsafe-inline\'; img-src data:">') in page
    # The one URL is the SVG namespace (a name, never fetched).
    assert set(re.findall(r"[a-z][a-z0-9+.-]*://[^\s\"'<>)]*", page, re.I)) == {"http://www.w3.org/2000/svg"}
    for pattern in (r"\bsrc\s*=", r"url\(", r"@import", r"\bfetch\(", r"XMLHttpRequest", r"<link",
                    r"<img", r"<iframe", r"WebSocket", r"EventSource", r"sendBeacon", r"import\("):
        assert not re.search(pattern, page, re.I), pattern
    assert set(re.findall(r'href="([^"]*)"', page)) <= {"#loops-sec", "#coroutines-sec", "#tasks-sec",
                                                        "#cpu-sec", "#idle-sec", "#timeline-sec"}


def big_document(tasks=10_000, name_len=100):
    """A report of `tasks` tasks (each its own coroutine), 10,000 stacks per flame and
    120,000 trace events, with long names: larger in every part than a real run of
    10,000 tasks (docs/html.md: 97,000 trace events, a few hundred stacks)."""
    frames = [{"kind": "task", "coroutine": "c" * name_len}] + [
        {"kind": "code", "file": f"/srv/app/module_{i}.py", "line": i, "function": f"f{i}_" + "x" * name_len}
        for i in range(2000)]
    doc = {"aioprof": 1, "python": "3.12.1", "pid": 1, "wall_s": 10.0, "frames": frames,
           "tasks": [], "coroutines": [], "callbacks": [], "sites": [], "loops": [],
           "samples": {"interval_s": 0.001, "count": 10000, "uncharged_s": 0.0,
                       "stacks": [{"stack": [0, 1 + i // 2000, 1 + i % 2000] + [1 + (i * 7 + d) % 2000 for d in range(28)],
                                   "samples": 1, "time_s": 0.001 + i * 1e-7} for i in range(10000)]},
           "idle_stacks": [{"stack": [0, 1 + i // 2000, 1 + i % 2000] + [1 + (i * 3 + d) % 2000 for d in range(28)],
                            "count": 2, "idle_s": 0.002 + i * 1e-7} for i in range(10000)]}
    for i in range(tasks):
        doc["tasks"].append({"id": i + 1, "name": f"Task-{i + 1}-" + "n" * name_len,
                             "coroutine": f"coro_{i}_" + "c" * name_len, "file": "/srv/app/x.py",
                             "line": i, "created_at": {"file": "/srv/app/x.py", "line": i, "function": "m"},
                             "parent": 1, "state": "done", "steps": i % 97, "busy_s": (i % 1000) * 1e-4,
                             "cpu_s": (i % 333) * 1e-4, "scheduled_s": (i % 777) * 1e-4,
                             "idle_s": i * 1e-4, "max_step_s": (i % 555) * 1e-5,
                             "await_sites": [{"file": "/srv/app/x.py", "line": 3, "function": "f",
                                              "count": 1, "idle_s": i * 1e-4}]})
        doc["coroutines"].append({"coroutine": f"coro_{i}_" + "c" * name_len, "file": "/srv/app/x.py",
                                  "line": i, "tasks": 1, "steps": i % 97, "busy_s": (i % 1000) * 1e-4,
                                  "cpu_s": 0.0, "scheduled_s": 0.0, "idle_s": i * 1e-4,
                                  "max_step_s": 0.0, "p99_step_s": 0.0})
    events = []
    for i in range(120_000):
        t = i * 5e-5
        events.append({"kind": ("run", "scheduled", "await", "tick", "select")[i % 5],
                       "task": 1 + i % tasks, "loop": 1, "start_s": t, "end_s": t + (i % 13) * 1e-5,
                       "site": {"file": "/srv/app/x.py", "line": 3, "function": "f"}})
    doc["trace"] = {"capacity": 120_000, "dropped": 5, "events": events}
    return doc


def test_ten_thousand_tasks_stay_within_two_megabytes():
    doc = big_document()
    page = html.render(doc)
    assert len(page.encode("utf-8")) <= html.MAX_BYTES
    data = embedded(page)
    tasks = data["tasks"]
    assert tasks["total"] == 10_000 and 0 < len(tasks["rows"]) < 10_000
    kept = {r[0] for r in tasks["rows"]}
    # the top rows by every sortable column are kept
    for field in ("busy_s", "idle_s", "scheduled_s", "cpu_s", "steps", "max_step_s"):
        top = max(doc["tasks"], key=lambda t: t[field])
        assert top["id"] in kept, field
    assert data["coroutines"]["total"] == 10_000
    # the heaviest stacks are kept, the rest said
    cpu = data["flames"]["cpu"]
    assert cpu["other"][0] == 10_000 - len(cpu["stacks"]) > 0
    assert cpu["stacks"][0][1] == round(max(s["time_s"] for s in doc["samples"]["stacks"]) * 1e6)
    tl = data["timeline"]
    assert tl["left"]["lanes"] > 0 and tl["dropped"] == 5


def test_absurd_names_still_stay_within_the_bound():
    doc = big_document(tasks=300, name_len=5000)
    assert len(html.render(doc).encode("utf-8")) <= html.MAX_BYTES
