"""Renderers of the report document (docs/json.md): ``write()`` picks one by format.

``text`` turns the document into tables for a terminal (`aioprof.report.text`);
``json`` writes the document itself; ``collapsed`` writes folded stacks for flame graphs
(`aioprof.report.collapsed`); ``trace`` writes Chrome trace-event JSON
(`aioprof.report.trace`); ``pprof`` writes a gzipped pprof profile (`aioprof.report.pprof`,
binary); ``html`` writes one self-contained page (`aioprof.report.html`, docs/html.md).
See docs/stacks.md.
"""
from __future__ import annotations

import io
import json
import os
from typing import IO, Optional

from aioprof.report import collapsed, html, pprof, text, trace

__all__ = ["BINARY_FORMATS", "FLAMES", "FORMATS", "SORTS", "VIEWS", "write"]

FORMATS = ("text", "json", "collapsed", "trace", "pprof", "html")
BINARY_FORMATS = ("pprof",)
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


def write(doc: dict, *, format: str = "text", file: IO, sort: str = "busy",
          limit: Optional[int] = None, by: str = "coroutine", show_internal: bool = False,
          width: Optional[int] = None, flame: str = "cpu") -> None:
    """Write the report document `doc` to the text stream `file` (format "pprof": a binary
    stream, or a text stream's ``buffer``).

    format "json": the document itself (``json.dump`` with indent=1, then a newline);
    sort, limit, by, show_internal and width are checked but do not change it.
    format "text": tables made by `aioprof.report.text.render` (see there for the options);
    with width None, a terminal gets lines fitted to its width and any other file (a
    file, a pipe) whole rows, unless COLUMNS is set.
    format "collapsed": the folded stacks of `aioprof.report.collapsed.render` for
    `flame` ("cpu", the default, "idle" or "wall").
    format "trace": ``json.dump`` of `aioprof.report.trace.render` (compact), then a
    newline.
    format "html": the page of `aioprof.report.html.render` (at most 2 MB; it shows
    the parts the document has and says which it lacks).
    format "pprof": the gzipped profile.proto of `aioprof.report.pprof.render` (bytes).
    A text stream is flushed and its ``buffer`` gets the bytes; a terminal is refused.
    `flame` only matters for "collapsed"; the text options do not change "collapsed",
    "trace", "pprof" or "html" (they are still checked).

    Raises ValueError for an unknown format, sort, by or flame, a bad limit or width,
    (collapsed, trace) a document without the part the format needs, or (pprof) a
    terminal or a text stream without a binary buffer; nothing is written then. Errors
    of `file` propagate.
    """
    check_options(format=format, sort=sort, limit=limit, by=by, width=width, flame=flame)
    if format == "pprof":
        _write_binary(pprof.render(doc), file)
        return
    if format == "json":
        json.dump(doc, file, indent=1)
        file.write("\n")
        return
    if format == "collapsed":
        file.write(collapsed.render(doc, flame))
        return
    if format == "html":
        file.write(html.render(doc))
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


def _write_binary(data: bytes, file: IO) -> None:
    if _is_terminal(file):
        raise ValueError("the pprof format is binary: write it to a file, not a terminal")
    if isinstance(file, io.TextIOBase):
        buffer = getattr(file, "buffer", None)
        if buffer is None:
            raise ValueError("the pprof format is binary: give a binary file (or one with a buffer)")
        file.flush()
        buffer.write(data)
        buffer.flush()
        return
    file.write(data)


def _is_terminal(file: IO) -> bool:
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
