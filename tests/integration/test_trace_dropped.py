"""A trace ring that overflows says so (issue 7, item 11): one line on stderr at report
time with the number of events dropped and the option that keeps more; the trace's
otherData and the JSON report's "trace" record the same count."""
from __future__ import annotations

import asyncio
import io
import json
import re
import textwrap

import aioprof

# 300 bare yields: every one is a step (run event) and a tick; a few hundred events.
PROGRAM = textwrap.dedent("""
    import asyncio, sys
    async def main():
        for _ in range(300):
            await asyncio.sleep(0)
    asyncio.run(main())
    print("program stdout")
    print("program stderr", file=sys.stderr)
""")

NOTE = re.compile(r"^aioprof: the trace ring overflowed: ([\d,]+) older events were dropped; "
                  r"it kept the newest ([\d,]+)\. (.*) keeps more \(40 bytes each\)\.$")


def run_with_buffer(run_aioprof, tmp_path, buffer):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM, encoding="utf-8")
    path = tmp_path / f"trace{buffer}.json"
    proc = run_aioprof(["--format", "trace", "--trace-buffer", str(buffer), "-o", path, prog],
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "program stdout\n"
    return proc, json.loads(path.read_text(encoding="utf-8"))


def test_overflow_is_said_once_on_stderr(run_aioprof, tmp_path):
    proc, trace = run_with_buffer(run_aioprof, tmp_path, 50)
    lines = proc.stderr.splitlines()
    assert lines[0] == "program stderr"
    notes = [line for line in lines if NOTE.match(line)]
    assert len(notes) == 1 and len(lines) == 2, proc.stderr
    dropped, kept, option = NOTE.match(notes[0]).groups()
    assert int(dropped.replace(",", "")) == trace["otherData"]["trace_dropped"] > 600
    assert int(kept.replace(",", "")) == trace["otherData"]["trace_capacity"] == 50
    assert option == "--trace-buffer N"


def test_no_note_when_nothing_was_dropped(run_aioprof, tmp_path):
    proc, trace = run_with_buffer(run_aioprof, tmp_path, 1_000_000)
    assert trace["otherData"]["trace_dropped"] == 0
    assert proc.stderr == "program stderr\n"


def test_api_report_says_it_too(capsys):
    async def main():
        for _ in range(100):
            await asyncio.sleep(0)

    with aioprof.Profiler(trace=True, trace_buffer=10) as p:
        asyncio.run(main())
    doc = p.stats()
    assert doc["trace"]["dropped"] > 200 and doc["trace"]["capacity"] == 10
    out = io.StringIO()
    p.report(format="trace", file=out)
    assert json.loads(out.getvalue())["otherData"]["trace_dropped"] == doc["trace"]["dropped"]
    err = capsys.readouterr().err.splitlines()
    (note,) = err
    dropped, kept, option = NOTE.match(note).groups()
    assert (int(dropped.replace(",", "")), kept, option) == (doc["trace"]["dropped"], "10",
                                                              "Profiler(trace_buffer=N)")
