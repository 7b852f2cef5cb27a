"""`--format html` in a real browser: Debian's headless Chromium opens the page from disk
with networking off (a dead proxy, every host unresolvable, and the page's own CSP), and
the test reads the DOM after the page's scripts ran (`--dump-dom`).

One run of a program with real sleeps and CPU burns, which measures itself
(perf_counter): its JSON report (`--by stack --trace`: samples, await stacks and the
trace) is checked against those measurements, re-rendered with `aioprof report
--format html`, and every figure the page shows must be the JSON report's, formatted
as the text report formats it. The URL asks the page to sort by idle time
(`#sort=idle`, a click the page's script sends to the header) and to click a cpu flame
frame (`#frame=burn`). Bounds: a burn lies inside one step (busy >= the burn), the
sleeper's idle lies inside its measured sleep.
"""
import json
import os
import re
import shutil
import subprocess
import textwrap
from html.parser import HTMLParser

import pytest

from aioprof.report import collapsed, text

pytestmark = pytest.mark.timing

HOSTILE = "</script><img src=x onerror=alert(1)>"
PROGRAM = textwrap.dedent("""\
    import asyncio, json, time

    HOSTILE = %r

    def burn(seconds):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            pass
        return time.perf_counter() - t0

    async def cruncher():
        spent = 0.0
        for _ in range(3):
            spent += burn(0.03)
            await asyncio.sleep(0.01)
        return spent

    async def sleeper():
        t0 = time.perf_counter()
        await asyncio.sleep(0.15)
        return time.perf_counter() - t0

    async def main():
        c = asyncio.create_task(cruncher(), name="cruncher")
        s = asyncio.create_task(sleeper(), name=HOSTILE)
        return await asyncio.gather(c, s)

    spent, slept = asyncio.run(main())
    print(json.dumps({"spent": spent, "slept": slept}))
""") % HOSTILE


def chromium():
    """Debian's chromium, or a skip (a failure under make test, AIOPROF_REQUIRE_REAL,
    where tools/install-deps.sh installs it)."""
    path = shutil.which("chromium")
    if path is None:
        reason = "chromium is not installed (Debian package chromium): no real browser"
        if os.environ.get("AIOPROF_REQUIRE_REAL"):
            pytest.fail(reason + " (AIOPROF_REQUIRE_REAL is set)", pytrace=False)
        pytest.skip(reason)
    return path


def browse(page, tmp, *args):
    """Run headless chromium on `page` (a URL) with networking off; its stdout."""
    cmd = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-sync",
           "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
           f"--user-data-dir={tmp}", "--virtual-time-budget=10000", "--window-size=1200,1800",
           *args, page]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, HOME=str(tmp)))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


class Dom(HTMLParser):
    """The tables (id -> rows of cell texts), and the attributes of elements with an id."""

    def __init__(self, markup):
        super().__init__(convert_charrefs=True)
        self.tables, self.attrs, self.tags, self.texts = {}, {}, [], []
        self._table = self._row = self._cell = None
        self.feed(markup)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if a.get("id"):
            self.attrs[a["id"]] = a
        if tag == "body":
            self.attrs["body"] = a
        if tag == "table":
            self._table = self.tables.setdefault(a.get("id"), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "text":
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "text" and self._cell is not None:
            self.texts.append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture(scope="module")
def run(tmp_path_factory, run_aioprof_module):
    d = tmp_path_factory.mktemp("html")
    (d / "prog.py").write_text(PROGRAM)
    done = run_aioprof_module(["--format", "json", "--by", "stack", "--trace", "-o", d / "r.json",
                               d / "prog.py"], cwd=d)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    again = run_aioprof_module(["report", d / "r.json", "--format", "html", "-o", d / "r.html"])
    assert again.returncode == 0 and again.stderr == "", again.stderr
    return measured, json.loads((d / "r.json").read_text()), d


@pytest.fixture(scope="module")
def page(run):
    """(the JSON report, the page's DOM after its scripts ran, the run's directory)."""
    _, doc, d = run
    dom = browse((d / "r.html").as_uri() + "#sort=idle&frame=burn", d / "chromium", "--dump-dom")
    return doc, dom, d


def visible(rows):
    return [r for r in rows if not r.get("internal")]


def test_the_json_report_holds_what_the_program_measured(run):
    measured, doc, _ = run
    tasks = {t["name"]: t for t in doc["tasks"]}
    assert tasks["cruncher"]["busy_s"] >= measured["spent"]
    sleeper = tasks[HOSTILE]
    assert sleeper["idle_s"] <= measured["slept"]
    assert sleeper["idle_s"] >= measured["slept"] - sleeper["busy_s"] - sleeper["scheduled_s"] - 1e-6


def test_the_page_ran_offline_and_without_errors(page):
    _, markup, _ = page
    dom = Dom(markup)
    assert dom.attrs["body"]["data-ready"] == "1"
    assert dom.attrs["body"]["data-errors"] == "0"
    assert dom.attrs["body"]["data-resources"] == "0"   # performance's resource entries
    assert "img" not in dom.tags                        # the hostile task name stayed text


def test_the_tables_are_the_json_reports_sorted_by_the_fragment(page):
    doc, markup, _ = page
    dom = Dom(markup)

    def site(t):
        return text._loc_of(t["await_sites"][0]) if t.get("await_sites") else "-"

    tasks = text._sorted(visible(doc["tasks"]), "idle_s")
    expect = [[text._int(t["id"]), t["name"], t["coroutine"], text._created_at(t["created_at"]),
               text._int(t["parent"]), t["state"], text._int(t["steps"]), text._ms(t["busy_s"]),
               text._ms(t["scheduled_s"]), text._ms(t["idle_s"]), text._ms(t["cpu_s"]),
               text._ms(t["max_step_s"]), site(t)] for t in tasks]
    header, *rows = dom.tables["tasks"]
    assert header[9] == "idle ms \u25bc" and dom.attrs["tasks"]["data-sorted"] == "idle ms desc"
    assert rows == expect
    assert HOSTILE in [r[1] for r in rows]
    coros = text._sorted(visible(doc["coroutines"]), "idle_s")
    expect = [[c["coroutine"], text._int(c["tasks"]), text._int(c["steps"]), text._ms(c["busy_s"]),
               text._ms(c["scheduled_s"]), text._ms(c["idle_s"]), text._ms(c["cpu_s"]),
               text._ms(c["max_step_s"]), text._ms(c["p99_step_s"]), text._loc(c["file"], c["line"])]
              for c in coros]
    header, *rows = dom.tables["coroutines"]
    assert header[5] == "idle ms \u25bc" and rows == expect and len(rows) >= 3


def test_a_clicked_flame_frame_shows_its_line_and_figures(page):
    doc, markup, _ = page
    dom = Dom(markup)
    detail = dom.attrs["cpu-detail"]
    label = detail["data-frame"]
    assert label.startswith("burn (prog.py:")
    assert label in dom.texts                           # drawn as an SVG text label
    (frame,) = {json.dumps(f) for f in doc["frames"] if collapsed.frame_text(f) == label}
    frame = json.loads(frame)
    path = tuple(detail["data-path"].split(";"))
    stacks = collapsed.stack_values(doc, "cpu")
    total_us = sum(v for s, v in stacks.items() if s[:len(path)] == path)
    assert abs(int(detail["data-total-us"]) - total_us) <= len(stacks)
    shown = re.search(r"total ([\d.]+) ms", markup).group(1)
    assert abs(float(shown) - int(detail["data-total-us"]) / 1e3) <= 0.05
    assert f"{frame['file']}:{frame['line']}" in markup   # the file:line, in full


def test_the_loops_section_and_timeline_are_drawn(page):
    doc, markup, _ = page
    dom = Dom(markup)
    (loop,) = doc["loops"]
    assert f"utilization {text._pct(loop['utilization'])}" in markup
    assert f"lag p50 {text._ms(loop['lag_p50_s'])} ms" in markup
    assert "timeline-canvas" in dom.attrs and 'class="missing"' not in markup
    assert f"busy-chart-{loop['id']}" in dom.attrs   # busy over time, drawn from the trace
    lanes = 1 + len({e["task"] for e in doc["trace"]["events"]
                     if e["kind"] in ("run", "scheduled", "await") and e.get("task") is not None})
    assert f"{lanes} lanes. " in markup


def test_screenshot(run):
    _, _, d = run
    shot = d / "shot.png"
    browse((d / "r.html").as_uri() + "#frame=burn", d / "chromium", "--hide-scrollbars",
           f"--screenshot={shot}")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_direct_run_without_trace_says_so(tmp_path, run_aioprof):
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = run_aioprof(["--format", "html", "-o", tmp_path / "d.html", tmp_path / "prog.py"], cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    page = (tmp_path / "d.html").read_text()
    data = json.loads(re.search(r'id="aioprof-data">(.*?)</script', page, re.S).group(1))
    assert "--trace" in data["timeline"]["missing"]
    labels = [f[0] for f in data["frames"]]
    assert any(labels[s[0][-1]].startswith("burn (") for s in data["flames"]["cpu"]["stacks"])
    assert data["flames"]["idle"]["stacks"]
