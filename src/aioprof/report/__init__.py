"""Renderers of the report document (docs/json.md): ``write()`` picks one by format.

``text`` turns the document into tables for a terminal (`aioprof.report.text`);
``json`` writes the document itself.
"""
from __future__ import annotations

import json
from typing import IO, Optional

from aioprof.report import text

__all__ = ["FORMATS", "SORTS", "VIEWS", "write"]

FORMATS = ("text", "json")
SORTS = text.SORTS
VIEWS = text.VIEWS


def check_options(*, format: str = "text", sort: str = "busy", limit: Optional[int] = None,
                  by: str = "coroutine", width: Optional[int] = None) -> None:
    """Raise ValueError, naming the choices, if an option of `write()` is out of range."""
    if format not in FORMATS:
        raise ValueError(f"unknown report format {format!r} (choose from {', '.join(FORMATS)})")
    text.check_options(sort=sort, limit=limit, by=by, width=width)


def write(doc: dict, *, format: str = "text", file: IO[str], sort: str = "busy",
          limit: Optional[int] = None, by: str = "coroutine", show_internal: bool = False,
          width: Optional[int] = None) -> None:
    """Write the report document `doc` to the text stream `file`.

    format "json": the document itself (``json.dump`` with indent=1, then a newline);
    sort, limit, by, show_internal and width are checked but do not change it.
    format "text": tables made by `aioprof.report.text.render` (see there for the options).

    Raises ValueError for an unknown format, sort or by, or a bad limit or width; errors
    of `file` propagate.
    """
    check_options(format=format, sort=sort, limit=limit, by=by, width=width)
    if format == "json":
        json.dump(doc, file, indent=1)
        file.write("\n")
        return
    ellipsis = "\u2026" if _can_encode(file, "\u2026") else "..."
    file.write(text.render(doc, sort=sort, limit=limit, by=by, show_internal=show_internal,
                           width=width, ellipsis=ellipsis))


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
