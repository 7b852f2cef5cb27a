"""Renderers of the report document (docs/json.md): ``write()`` picks one by format.

``text`` turns the document into tables for a terminal (`aioprof.report.text`);
``json`` writes the document itself; ``collapsed`` writes folded stacks for flame graphs
(`aioprof.report.collapsed`); ``trace`` writes Chrome trace-event JSON
(`aioprof.report.trace`). See docs/stacks.md.
"""
from __future__ import annotations

import json
import os
from typing import IO, Optional

from aioprof.report import collapsed, text, trace

__all__ = ["FLAMES", "FORMATS", "SORTS", "VIEWS", "write"]

FORMATS = ("text", "json", "collapsed", "trace")
SORTS = text.SORTS
VIEWS = text.VIEWS
FLAMES = collapsed.FLAMES


def check_options(*, format: str = "text", sort: str = "busy", limit: Optional[int] = None,
                  by: str = "coroutine", width: Optional[int] = None,
                  flame: str = "cpu") -> None:
    """Raise ValueError, naming the choices, if an option of `write()` is out of range."""
    if format not in FORMATS:
        raise ValueError(f"unknown report format {format!r} (choose from {', '.join(FORMATS)})")
    if flame not in FLAMES:
        raise ValueError(f"unknown flame {flame!r} (choose from {', '.join(FLAMES)})")
    text.check_options(sort=sort, limit=limit, by=by, width=width)


def write(doc: dict, *, format: str = "text", file: IO[str], sort: str = "busy",
          limit: Optional[int] = None, by: str = "coroutine", show_internal: bool = False,
          width: Optional[int] = None, flame: str = "cpu") -> None:
    """Write the report document `doc` to the text stream `file`.

    format "json": the document itself (``json.dump`` with indent=1, then a newline);
    sort, limit, by, show_internal and width are checked but do not change it.
    format "text": tables made by `aioprof.report.text.render` (see there for the options);
    with width None, a terminal gets lines fitted to its width and any other file (a
    file, a pipe) whole rows, unless COLUMNS is set.
    format "collapsed": the folded stacks of `aioprof.report.collapsed.render` for
    `flame` ("cpu", the default, "idle" or "wall").
    format "trace": ``json.dump`` of `aioprof.report.trace.render` (compact), then a
    newline.
    `flame` only matters for "collapsed"; the text options do not change "collapsed" or
    "trace" (they are still checked).

    Raises ValueError for an unknown format, sort, by or flame, a bad limit or width, or
    (collapsed, trace) a document without the part the format needs; nothing is written
    then. Errors of `file` propagate.
    """
    check_options(format=format, sort=sort, limit=limit, by=by, width=width, flame=flame)
    if format == "json":
        json.dump(doc, file, indent=1)
        file.write("\n")
        return
    if format == "collapsed":
        file.write(collapsed.render(doc, flame))
        return
    if format == "trace":
        obj = trace.render(doc)
        file.write(json.dumps(obj, separators=(",", ":")))
        file.write("\n")
        return
    ellipsis = "\u2026" if _can_encode(file, "\u2026") else "..."
    if width is None and not os.environ.get("COLUMNS") and not _is_terminal(file):
        width = text.FULL_WIDTH   # a file or a pipe gets whole rows: only a terminal is fitted
    file.write(text.render(doc, sort=sort, limit=limit, by=by, show_internal=show_internal,
                           width=width, ellipsis=ellipsis))


def _is_terminal(file: IO[str]) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _can_encode(file: IO[str], s: str) -> bool:
    """True unless `file` declares an encoding that cannot encode `s` (e.g. ASCII)."""
    encoding = getattr(file, "encoding", None)
    if not encoding:
        return True
    try:
        s.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True
