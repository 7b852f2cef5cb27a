"""Folded stacks ("collapsed" format) of the report document, for flame graphs.

``render(doc, flame)`` returns one line per async call stack (docs/stacks.md)::

    [task main];handler (app.py:12);parse (app.py:40) 3150

frames root first, separated by ``;``, then a space and the value in integer
microseconds. flamegraph.pl, inferno and speedscope read this format.

flame:
    ``cpu``: the sampled on-loop time (``samples.stacks``, ``time_s``);
    ``idle``: the await time (``idle_stacks``, ``idle_s``), in task time: every
    suspended task's wait added up, so ten tasks awaiting for 1 s together give 10 s, and
    an idle flame can be many times the wall time;
    ``wall``: both, added up per stack (on-loop time plus task-time waits).

Frame text: a code frame reads ``function (file:line)`` with the file's base name;
markers read ``[task coroutine]``, ``[callback name]`` and ``[asyncio]``. ``;`` (the
frame separator) becomes ``,`` and line breaks become spaces inside names.

Each entry of the document is converted to microseconds (rounded) on its own, then
entries whose stack text is equal are added up; so a ``wall`` line is exactly the sum
of the ``cpu`` and ``idle`` lines of the same stack. Lines with value 0 are left out and
the lines are sorted by stack text.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["FLAMES", "frame_text", "frame_texts", "render", "stack_texts", "stack_values"]

FLAMES = ("cpu", "idle", "wall")

# Where each flame's entries are: (document key, time field, message when it is missing).
_NO_SAMPLES = ("no samples in the report: sampling was off (--interval 0, "
               "Profiler(interval_ms=0)) or the profiler does not sample")
_NO_IDLE = ("no idle stacks in the report: async stacks were off (they are on with "
            "--format collapsed or --by stack, Profiler(async_stacks=True))")


def _clean(text: Any) -> str:
    """`text` as a str without the frame separator or line breaks."""
    s = str(text)
    if ";" in s:
        s = s.replace(";", ",")
    if "\n" in s or "\r" in s:
        s = s.replace("\r\n", " ").replace("\r", " ").replace("\n", " ")
    return s


def frame_text(frame: Any) -> str:
    """The text of one entry of doc["frames"]."""
    if not isinstance(frame, dict):
        return "[unknown]"
    kind = frame.get("kind")
    if kind == "code":
        function = _clean(frame.get("function") or "?")
        file = frame.get("file")
        if not file:
            return function
        loc = os.path.basename(str(file)) or str(file)
        line = frame.get("line")
        if line is not None:
            loc = f"{loc}:{line}"
        return f"{function} ({_clean(loc)})"
    if kind == "task":
        return f"[task {_clean(frame.get('coroutine') or '?')}]"
    if kind == "callback":
        return f"[callback {_clean(frame.get('callback') or '?')}]"
    if kind == "asyncio":
        return "[asyncio]"
    return f"[{_clean(kind or 'unknown')}]"


def frame_texts(doc: Dict[str, Any]) -> List[str]:
    """The text of every frame of the document, by index."""
    frames = doc.get("frames")
    return [frame_text(f) for f in frames] if isinstance(frames, list) else []


def stack_texts(stack: Any, texts: Sequence[str]) -> Optional[tuple]:
    """The frame texts of a stack (list of indices into frames), root first."""
    if not isinstance(stack, list):
        return None
    out = []
    for index in stack:
        if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(texts):
            out.append(texts[index])
        else:
            out.append("[unknown]")
    return tuple(out) if out else ("[no frames]",)


def _entries(doc: Dict[str, Any], flame: str) -> List[tuple]:
    """(entries list, time field) pairs the flame is made of; ValueError if missing."""
    parts = []
    if flame in ("cpu", "wall"):
        samples = doc.get("samples")
        if not isinstance(samples, dict) or not isinstance(samples.get("stacks"), list):
            raise ValueError(_NO_SAMPLES)
        parts.append((samples["stacks"], "time_s"))
    if flame in ("idle", "wall"):
        idle = doc.get("idle_stacks")
        if not isinstance(idle, list):
            raise ValueError(_NO_IDLE)
        parts.append((idle, "idle_s"))
    return parts


def stack_values(doc: Dict[str, Any], flame: str = "cpu") -> Dict[tuple, int]:
    """{stack as a tuple of frame texts: microseconds} of a flame (zeros included).

    Raises ValueError for an unknown flame or when the document lacks the part it needs.
    """
    if flame not in FLAMES:
        raise ValueError(f"unknown flame {flame!r} (choose from {', '.join(FLAMES)})")
    if not isinstance(doc, dict):
        raise ValueError("the report document must be a dict")
    parts = _entries(doc, flame)
    texts = frame_texts(doc)
    values: Dict[tuple, int] = {}
    for entries, field in parts:
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            key = stack_texts(entry.get("stack"), texts)
            seconds = entry.get(field)
            if key is None or isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                continue
            if not seconds >= 0 or seconds == float("inf"):
                continue
            values[key] = values.get(key, 0) + int(round(seconds * 1e6))
    return values


def render(doc: Dict[str, Any], flame: str = "cpu") -> str:
    """The folded stacks of `doc` for `flame` ("cpu", "idle" or "wall"), one line each.

    Returns "" when there is no stack with a non-zero value. Raises ValueError for an
    unknown flame, or when the document lacks the part the flame needs ("samples" for
    cpu, "idle_stacks" for idle, both for wall).
    """
    rows = sorted((";".join(stack), value)
                  for stack, value in stack_values(doc, flame).items() if value > 0)
    return "".join(f"{stack} {value}\n" for stack, value in rows)
