"""`aioprof.Profiler`'s arguments: milliseconds throughout, as the command line's options
(``interval_ms`` = ``--interval``, ``cpu_window_ms`` = ``--cpu-window``, ``slow_ms`` =
``--slow-ms``), the old second-valued keywords still working with a DeprecationWarning,
and a TypeError or ValueError naming the argument for a bad value."""
from __future__ import annotations

import io
import json
import warnings

import pytest

import aioprof


@pytest.mark.parametrize("kwargs, error, words", [
    ({"interval_ms": "1"}, TypeError, "interval_ms must be a number (int or float), not str '1'"),
    ({"interval": "1"}, TypeError, "interval must be a number (int or float), not str '1'"),
    ({"cpu_window_ms": None}, None, None),                      # None: the default
    ({"slow_ms": "100"}, TypeError, "slow_ms must be a number"),
    ({"slow_ms": True}, TypeError, "slow_ms must be a number"),
    ({"max_tasks": 1.5}, TypeError, "max_tasks must be an int, not float 1.5"),
    ({"trace_buffer": "5"}, TypeError, "trace_buffer must be an int"),
    ({"max_tasks": -1}, ValueError, "max_tasks must be an int >= 0, not -1"),
    ({"trace_buffer": 0}, ValueError, "trace_buffer must be an int from 1 to 100000000"),
    ({"interval_ms": -1}, ValueError, "interval_ms must be >= 0 milliseconds, not -1"),
    ({"interval_ms": float("nan")}, ValueError, "interval_ms must be >= 0 milliseconds"),
    ({"cpu_window_ms": 0}, ValueError, "cpu_window_ms must be > 0 milliseconds, not 0"),
    ({"slow_ms": float("inf")}, ValueError, "slow_ms must be >= 0 milliseconds"),
    ({"interval": 0.001, "interval_ms": 1}, TypeError, "give interval_ms (milliseconds) or interval"),
])
def test_bad_arguments_name_the_parameter(kwargs, error, words):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if error is None:
            aioprof.Profiler(**kwargs)
            return
        with pytest.raises(error) as info:
            aioprof.Profiler(**kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("old, new", [({"interval": 0.002}, {"interval_ms": 2.0}),
                                      ({"cpu_window": 0.004}, {"cpu_window_ms": 4.0})])
def test_old_keywords_in_seconds_are_deprecated(old, new):
    with pytest.warns(DeprecationWarning, match=f"use {next(iter(new))}=milliseconds") as record:
        p = aioprof.Profiler(**old)
    assert record[0].filename == __file__        # points at the caller
    ((name, value),) = new.items()
    assert getattr(p, name) == pytest.approx(value)


def test_settings_reach_the_document_in_milliseconds():
    # The document echoes the settings (cpu_window_s, slow_s): the API's milliseconds
    # and the deprecated seconds give the same figures.
    with aioprof.Profiler(cpu_window_ms=2, slow_ms=30) as p:
        pass
    with pytest.warns(DeprecationWarning):
        old = aioprof.Profiler(cpu_window=0.002, slow_ms=30)
    with old:
        pass
    for doc in (p.stats(), old.stats()):
        assert doc["cpu_window_s"] == pytest.approx(0.002) and doc["slow_s"] == pytest.approx(0.03)


def test_report_takes_flame():
    with aioprof.Profiler(async_stacks=True) as p:
        pass
    out = io.StringIO()
    p.report(format="collapsed", file=out, flame="idle")
    assert out.getvalue() == ""                  # no task waited: no idle stack
    with pytest.raises(ValueError, match="unknown flame"):
        p.report(format="collapsed", file=io.StringIO(), flame="hot")
    out = io.StringIO()
    p.report(format="json", file=out, flame="wall")
    assert json.loads(out.getvalue())["aioprof"] == 1
