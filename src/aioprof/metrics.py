"""Prometheus metrics of aioprof, for the official ``prometheus_client``.

``prometheus_client`` is imported only when metrics are collected (``import aioprof``
imports neither it nor asyncio). Two collectors:

- `ProfilerCollector(profiler)`: the loops, the lag histogram, the tasks by state and the
  per-coroutine counters of a running `aioprof.Profiler` (``python -m aioprof --metrics
  HOST:PORT`` serves one on ``/metrics``);
- `aioprof.LoopMonitor` is itself a collector (its ``collect()``): the loop figures of one
  loop, without a profiler.

Register one of them with a registry (``prometheus_client.REGISTRY.register(c)``), not both
for the same loop: they share the loop metrics' names. Names, types, labels and
definitions: docs/prometheus.md. Every time is in seconds, every counter ends in
``_total``, read from the core's figures at each scrape: a scrape never runs the program's
code and holds the GIL only while the core copies its per-coroutine and per-loop totals
(no per-task records).

Under ``prometheus_client``'s multiprocess mode (gunicorn), `publish_multiprocess(profiler)`
writes the same metrics into the library's per-process value files instead, which one
``MultiProcessCollector`` merges over all the processes (docs/prometheus.md).
"""
from __future__ import annotations

import _thread
import math
import os
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

__all__ = ["ProfilerCollector", "LAG_BUCKETS", "DEFAULT_TOP", "OTHER", "ENDED", "monitor_metrics",
           "publish_multiprocess", "MultiprocessPublisher", "MULTIPROCESS_GAUGES"]

# Lag histogram bounds: powers of two of nanoseconds, from 4.096 us to 17.2 s. They are
# edges of aioprof's own histogram (8 buckets per power of two), so the bucket counts are
# exact, not estimated: the bucket `le` counts the lags below that bound.
LAG_BUCKETS: Tuple[int, ...] = tuple(2 ** k for k in range(12, 35))
DEFAULT_TOP = 20      # coroutines with labels of their own; the rest are "other"
OTHER = "other"       # coroutine label of all the coroutines past the top N
ENDED = "ended"       # loop label of all ended loops (closed or garbage-collected), summed

_LOOP_LABELS = ("loop", "type", "thread")


def _seconds(value_ns: Optional[int]) -> Optional[float]:
    return None if value_ns is None else value_ns / 1e9


class _Families:
    """The metric families of one collect(), created on first use, in a fixed order."""

    def __init__(self, high: Optional[Dict[Tuple[str, Tuple[str, ...]], float]] = None) -> None:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)
        self.kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
                      "histogram": HistogramMetricFamily}
        self.families: Dict[str, Any] = {}
        # With `high` (counter sample -> the most it has shown), a counter never shows
        # less than it showed before: a pending task's idle time counts up to now and is
        # revised down when its wake-up turns out to have been earlier (a hand-over from
        # another thread); Prometheus would read a drop as a counter reset.
        self.high = high

    def add(self, kind: str, name: str, doc: str, labels: Sequence[str], values: Sequence[str],
            value: Optional[float] = None, **kw: Any) -> None:
        """One sample (or histogram) of family `name`; a None value is left out (a figure
        the loop class does not have, as under uvloop: unavailable, never 0)."""
        if value is None and kind != "histogram":
            return
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = self.kinds[kind](name, doc, labels=list(labels))
        if kind == "histogram":
            fam.add_metric(list(values), kw["buckets"], kw["sum_value"])
            return
        if kind == "counter" and self.high is not None and value is not None:
            key = (name, tuple(values))
            value = max(value, self.high.get(key, value))
            self.high[key] = value
        fam.add_metric(list(values), value)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.families.values())


# (kind, metric name, key in the monitor's stats() / the core's loop record, help text)
_LOOP_METRICS = (
    ("gauge", "aioprof_loop_utilization", "utilization",
     "Busy time over the loop's running time since profiling (or the monitor) started: "
     "1 - select wait / wall"),
    ("gauge", "aioprof_loop_load", "load",
     "The loop's load, smoothed exponentially with a 1 s time constant (select wait counts "
     "as idle only up to its timeout)"),
    ("counter", "aioprof_loop_busy_seconds", "busy_s",
     "Time the loop was busy: its running time minus the select wait"),
    ("counter", "aioprof_loop_wall_seconds", "wall_s", "Time inside the loop's ticks"),
    ("counter", "aioprof_loop_select_wait_seconds", "select_wait_s",
     "Time the loop was blocked in select"),
    ("counter", "aioprof_loop_ticks", "ticks", "Loop iterations (BaseEventLoop._run_once)"),
    ("counter", "aioprof_loop_handles", "handles", "Callbacks and task steps the loop ran"),
    ("counter", "aioprof_loop_select_calls", "select_calls", "Calls to select"),
)
_GAUGES = {name for kind, name, _, _ in _LOOP_METRICS if kind == "gauge"}


def _loop_samples(fams: _Families, values: Sequence[str], figures: Dict[str, Any],
                  gauges: bool = True) -> None:
    for kind, name, key, doc in _LOOP_METRICS:
        if gauges or name not in _GAUGES:
            fams.add(kind, name, doc, _LOOP_LABELS, values, figures.get(key))


def monitor_metrics(monitor: Any) -> Iterator[Any]:
    """The metric families of one `LoopMonitor` (what its ``collect()`` returns): the
    loop figures of its ``stats()``, labelled ``loop`` (the monitor's number), ``type``
    (the loop's class) and ``thread`` (the thread that opened the monitor)."""
    fams = _Families()
    if monitor._id is not None and monitor.available:
        values = (str(monitor._id), type(monitor.loop).__name__, monitor.thread_name)
        _loop_samples(fams, values, monitor.stats())
    return iter(fams)


def _lag_histogram(records: Iterable[Dict[str, Any]]) -> Tuple[List[Tuple[str, float]], float]:
    """Prometheus buckets (cumulative, +Inf last) and the sum in seconds of the lag
    histograms of `records` (the core's loop records) added together."""
    from prometheus_client.utils import floatToGoString

    counts = [0] * (len(LAG_BUCKETS) + 1)
    total_ns = 0
    for rec in records:
        total_ns += rec.get("lag_sum_ns") or 0
        for upper, count in rec.get("lag_buckets") or ():
            i = 0
            while i < len(LAG_BUCKETS) and LAG_BUCKETS[i] < upper:
                i += 1
            counts[i] += count     # all its values are below LAG_BUCKETS[i]
    buckets, running = [], 0
    for bound, count in zip([*LAG_BUCKETS, None], counts):
        running += count
        buckets.append(("+Inf" if bound is None else floatToGoString(bound / 1e9), float(running)))
    return buckets, total_ns / 1e9


def _loop_figures(rec: Dict[str, Any]) -> Dict[str, Any]:
    """A core loop record (ns) with the keys of `LoopMonitor.stats()` (seconds)."""
    out = {k: v for k, v in rec.items() if not k.endswith("_ns")}
    for key in ("busy_ns", "wall_ns", "select_wait_ns"):
        out[key[:-3] + "_s"] = _seconds(rec.get(key))
    out["load"] = rec.get("load_smoothed")
    return out


class ProfilerCollector:
    """A ``prometheus_client`` collector of a running `aioprof.Profiler` (after ``stop()``,
    its final figures).

    Per loop (labels ``loop``, ``type``, ``thread``): the loop metrics of `LoopMonitor`
    plus ``aioprof_loop_slow_steps_total`` and the histogram ``aioprof_loop_lag_seconds``;
    running loops each by the id the report gives them (``loop 1`` is ``loop="1"``), all
    ended loops summed in ``loop="ended"``. ``aioprof_tasks`` (gauge, label ``state``:
    running, scheduled, idle), ``aioprof_tasks_finished_total`` (``state``: done,
    cancelled, failed, destroyed). Per coroutine function (label ``coroutine``, its
    qualified name): busy, scheduled, idle and cpu seconds, steps, tasks and slow steps,
    for the first `top` coroutines (by busy time when chosen; once chosen a coroutine keeps
    its label, so every counter only grows), the rest summed as ``coroutine="other"``.
    asyncio's own coroutines are always in "other".

    Counters never go down from one collect to the next (Prometheus reads a drop as a
    reset): a pending task's idle and scheduled time count up to the moment of the collect
    and can be revised down by a few ms at its wake-up, so a counter shows the most it
    has shown until the figure passes it again (the final figures can then be above the
    report's by that revision).

    Args:
        profiler: the `aioprof.Profiler` to read.
        top: coroutines with a label of their own (int >= 0, default 20).
        monotonic: keep counters from going down (default True; False gives the core's
            figures as they are, for callers that handle decreases themselves).
    """

    def __init__(self, profiler: Any, top: int = DEFAULT_TOP, monotonic: bool = True) -> None:
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise ValueError(f"top must be an int >= 0, not {top!r}")
        self.profiler = profiler
        self.top = top
        self._chosen: Dict[str, None] = {}   # coroutines with their own label, in order chosen
        self._high: Optional[Dict[Tuple[str, Tuple[str, ...]], float]] = {} if monotonic else None
        self._lock = _thread.allocate_lock()   # scrapes may come from several threads

    def describe(self) -> List[Any]:
        """Nothing: the families depend on the run (registering never reads the core)."""
        return []

    def collect(self) -> Iterator[Any]:
        with self._lock:
            fams = _Families(self._high)
            doc = self.profiler._metrics()
            if doc is None:
                return iter(fams)
            self._loops(fams, doc)
            self._tasks(fams, doc)
            self._coroutines(fams, doc)
            return iter(fams)

    def _loops(self, fams: _Families, doc: Dict[str, Any]) -> None:
        running = [rec for rec in doc["loops"] if not rec.get("destroyed")]
        ended = [rec for rec in doc["loops"] if rec.get("destroyed")] + list(doc["loops_folded"])
        groups = [((str(rec["id"]), rec["type"], rec.get("thread_name") or str(rec["thread"])), [rec])
                  for rec in running]
        if ended:
            groups.append(((ENDED, "", ""), ended))
        for values, recs in groups:
            if len(recs) == 1 and values[0] != ENDED:
                _loop_samples(fams, values, _loop_figures(recs[0]))
            else:   # the sum of the ended loops: counters only
                summed: Dict[str, Any] = {}
                for _, _, key, _ in _LOOP_METRICS:
                    figures = [_loop_figures(r).get(key) for r in recs]
                    known = [f for f in figures if f is not None]
                    summed[key] = sum(known) if known else None
                _loop_samples(fams, values, summed, gauges=False)
            fams.add("counter", "aioprof_loop_slow_steps",
                     "Steps, callbacks and ticks at least --slow-ms long", _LOOP_LABELS, values,
                     float(sum(r["slow_total"] for r in recs)))
            if all(r.get("lag_count") is not None for r in recs):
                buckets, total = _lag_histogram(recs)
                fams.add("histogram", "aioprof_loop_lag_seconds",
                         "Time from ready to run of every handle (callback, timer, I/O callback, "
                         "task step)", _LOOP_LABELS, values, buckets=buckets, sum_value=total)

    def _tasks(self, fams: _Families, doc: Dict[str, Any]) -> None:
        for state, n in doc["tasks_now"].items():
            fams.add("gauge", "aioprof_tasks", "Live tasks now, by state (running, scheduled: "
                     "ready and waiting for the loop, idle: suspended at an await)",
                     ("state",), (state,), float(n))
        for state, n in doc["tasks_ended"].items():
            fams.add("counter", "aioprof_tasks_finished", "Tasks that finished, by how "
                     "(done, cancelled, failed, destroyed: garbage-collected while pending)",
                     ("state",), (state,), float(n))

    def _coroutines(self, fams: _Families, doc: Dict[str, Any]) -> None:
        keys = ("busy_ns", "scheduled_ns", "idle_ns", "cpu_ns", "steps", "tasks", "slow_steps")
        rows: Dict[str, Dict[str, int]] = {}
        for rec in doc["coroutines"]:
            name = OTHER if rec.get("internal") else rec["coroutine"]
            row = rows.setdefault(name, dict.fromkeys(keys, 0))
            for key in keys:
                row[key] += rec.get(key) or 0
        if len(self._chosen) < self.top:
            candidates = sorted((n for n in rows if n != OTHER and n not in self._chosen),
                                key=lambda n: -rows[n]["busy_ns"])
            for name in candidates[:self.top - len(self._chosen)]:
                self._chosen[name] = None
        out: Dict[str, Dict[str, int]] = {}
        for name, row in rows.items():
            target = out.setdefault(name if name in self._chosen else OTHER, dict.fromkeys(keys, 0))
            for key in keys:
                target[key] += row[key]
        helps = {
            "busy_ns": ("aioprof_coroutine_busy_seconds", "Time the coroutine's tasks ran on the loop"),
            "scheduled_ns": ("aioprof_coroutine_scheduled_seconds",
                             "Time its tasks were ready, waiting for the loop"),
            "idle_ns": ("aioprof_coroutine_idle_seconds", "Time its tasks were suspended at an await"),
            "cpu_ns": ("aioprof_coroutine_cpu_seconds", "Thread CPU time of its tasks' steps"),
            "steps": ("aioprof_coroutine_steps", "Steps of its tasks (start and every resumption)"),
            "tasks": ("aioprof_coroutine_tasks", "Tasks created running it"),
            "slow_steps": ("aioprof_coroutine_slow_steps", "Its steps at least --slow-ms long"),
        }
        for key, (name, doc_text) in helps.items():
            for coro in [*self._chosen, OTHER]:
                if coro in out:
                    value = out[coro][key]
                    fams.add("counter", name, doc_text, ("coroutine",), (coro,),
                             value / 1e9 if key.endswith("_ns") else float(value))


# How MultiProcessCollector merges each gauge over the processes: the live tasks are
# summed over the live processes; a loop's ratios are per process (a "pid" label).
MULTIPROCESS_GAUGES = {"aioprof_tasks": "livesum", "aioprof_loop_utilization": "liveall",
                       "aioprof_loop_load": "liveall"}
MULTIPROC_ENV = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


class MultiprocessPublisher:
    """Copies the figures of a `ProfilerCollector` into ``prometheus_client`` metric
    objects, whose values multiprocess mode keeps in this process's value files: made by
    `publish_multiprocess`, which documents it. `publish()` publishes now; `stop()` makes
    a last publish and ends the thread (idempotent; `Profiler.stop()` calls it)."""

    def __init__(self, profiler: Any, interval_s: float = 1.0, top: int = DEFAULT_TOP) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) \
                or not math.isfinite(interval_s) or interval_s <= 0:
            raise ValueError(f"interval_s must be a number > 0, not {interval_s!r}")
        # (the core's figures as they are: counters are written as signed changes)
        self.collector = ProfilerCollector(profiler, top=top, monotonic=False)
        self.profiler = profiler
        self.interval_s = float(interval_s)
        self._metrics: Dict[str, Any] = {}          # family name -> prometheus_client metric
        # counter samples published: key -> (prometheus_client value object, total)
        self._last: Dict[Tuple[str, Tuple[str, ...]], Tuple[Any, float]] = {}
        self._seen: set = set()                     # keys of this publish
        self._gauges: Dict[str, set] = {}           # gauge -> label values set last time
        self._lock = _thread.allocate_lock()        # one publish at a time
        self._wake = _thread.allocate_lock()        # released by stop(): the thread ends
        self._wake.acquire()
        self._stopped = False
        self.failed: Optional[str] = None           # the fault that ended publishing

    def start(self) -> "MultiprocessPublisher":
        self.profiler._stop_hooks.append(self.stop)
        _thread.start_new_thread(self._run, ())
        return self

    def _run(self) -> None:
        while not self._wake.acquire(timeout=self.interval_s):
            self.publish()
        self._wake.release()

    def stop(self) -> None:
        """The last publish (the profiler's final figures after its stop()), then no more."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self.publish(final=True)
        self._wake.release()

    def publish(self, final: bool = False) -> None:
        """Write the figures of now into the value files (counters by their increase since
        the last publish). A fault stops publishing, with one warning."""
        with self._lock:
            if self.failed is not None or (self._stopped and not final):
                return
            try:
                seen = set()
                self._seen = set()
                for fam in self.collector.collect():
                    self._family(fam)
                    seen.add(fam.name)
                for name in set(self._gauges) - seen:   # all its loops ended
                    self._gone(name, set())
                self._drop_vanished()
            except Exception as e:   # never hurt the program: publishing stops
                self.failed = f"{type(e).__name__}: {e}"
                warnings.warn(f"aioprof: multiprocess metrics stopped ({self.failed})",
                              RuntimeWarning, stacklevel=2)

    def _metric(self, fam: Any, labels: Sequence[str]) -> Any:
        metric = self._metrics.get(fam.name)
        if metric is None:
            import prometheus_client as pc
            kw: Dict[str, Any] = {"registry": None}    # only the value files see them
            if fam.type == "gauge":
                cls = pc.Gauge
                kw["multiprocess_mode"] = MULTIPROCESS_GAUGES[fam.name]
            elif fam.type == "counter":
                cls = pc.Counter
            else:
                cls = pc.Histogram
                kw["buckets"] = [b / 1e9 for b in LAG_BUCKETS]
            metric = self._metrics[fam.name] = cls(fam.name, fam.documentation, list(labels), **kw)
        return metric

    def _increase(self, value_object: Any, key: Tuple[str, Tuple[str, ...]], value: float) -> None:
        """Add to `value_object` (prometheus_client's value of one sample) what `value`
        changed since the last publish, so that its total is `value`. The change is
        signed: the core revises a pending task's idle time down when it learns the task
        was ready earlier (a ProfilerCollector's counter does the same), and the final
        totals must be the report's."""
        last = self._last.get(key)
        delta = value - (last[1] if last is not None else 0.0)
        if delta:
            value_object.inc(delta)
        self._last[key] = (value_object, value)
        self._seen.add(key)

    def _drop_vanished(self) -> None:
        """Series the collector no longer gives (a loop that ended: its figures moved to
        loop="ended") go back to 0, so the sum over the loops stays the true total (a
        value file cannot drop a series; Prometheus reads the drop as a counter reset)."""
        for key in set(self._last) - self._seen:
            value_object, value = self._last.pop(key)
            if value:
                value_object.inc(-value)

    def _family(self, fam: Any) -> None:
        if fam.type == "histogram":
            self._histogram(fam)
            return
        labels = list(fam.samples[0].labels) if fam.samples else []
        metric = self._metric(fam, labels)
        if fam.type == "gauge":
            now = set()
            for s in fam.samples:
                values = tuple(s.labels[k] for k in labels)
                metric.labels(*values).set(s.value)
                now.add(values)
            self._gone(fam.name, now)
            return
        for s in fam.samples:
            if s.name.endswith("_total"):
                values = tuple(s.labels[k] for k in labels)
                self._increase(metric.labels(*values)._value, (fam.name, values), s.value)

    def _gone(self, name: str, now: set) -> None:
        """Gauge `name` has the series `now`: those it had and has no more (a loop that
        ended) become NaN (a gauge's value file cannot drop a series)."""
        for values in self._gauges.get(name, set()) - now:
            self._metrics[name].labels(*values).set(math.nan)
        self._gauges[name] = now

    def _histogram(self, fam: Any) -> None:
        """The lag histogram: each bucket's count (not cumulative, as prometheus_client
        keeps them) and the sum increased by what they grew since the last publish, so
        the merged histogram is the exact sum of the processes' own."""
        by_series: Dict[Tuple[str, ...], Dict[str, float]] = {}
        names: List[str] = []
        for s in fam.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_sum"):
                names = [k for k in s.labels if k != "le"]
                values = tuple(s.labels[k] for k in names)
                key = s.labels.get("le", "_sum")
                by_series.setdefault(values, {})[key] = s.value
        if not by_series:
            return
        metric = self._metric(fam, names)
        for values, series in by_series.items():
            child = metric.labels(*values)
            buckets, sums = child._buckets, child._sum   # prometheus_client's value objects
            from prometheus_client.utils import floatToGoString
            bounds = [floatToGoString(b / 1e9) for b in LAG_BUCKETS] + ["+Inf"]
            below = 0.0
            for i, bound in enumerate(bounds):
                cumulative = series.get(bound, below)
                self._increase(buckets[i], (fam.name + "_bucket", values + (bound,)), cumulative - below)
                below = cumulative
            self._increase(sums, (fam.name + "_sum", values), series.get("_sum", 0.0))


def publish_multiprocess(profiler: Any, interval_s: float = 1.0,
                         top: int = DEFAULT_TOP) -> MultiprocessPublisher:
    """Publish the metrics of `profiler` (a started `aioprof.Profiler`) through
    ``prometheus_client``'s multiprocess mode, for a ``MultiProcessCollector`` in another
    process (gunicorn's master) to merge with those of the other workers.

    A daemon thread (``_thread``) reads the profiler's totals every `interval_s` seconds
    (what a `ProfilerCollector` with this `top` reads at a scrape: never the report's
    snapshot) and writes them into ``prometheus_client`` metrics of the same names,
    types and labels, which multiprocess mode keeps in this process's value files:
    counters increased by their growth since the last publish (so the merged counter is
    the sum over the processes, dead ones included); the gauge ``aioprof_tasks`` with
    ``multiprocess_mode="livesum"`` (the live processes' sum), ``aioprof_loop_utilization``
    and ``aioprof_loop_load`` with ``"liveall"`` (a ``pid`` label per process); the lag
    histogram bucket by bucket, exactly. A loop that ends moves to ``loop="ended"``: under
    its own label its counters go back to 0 and its gauges become NaN. At
    ``profiler.stop()`` a last publish gives the final figures, and the thread ends.

    Raises ValueError if neither ``PROMETHEUS_MULTIPROC_DIR`` nor
    ``prometheus_multiproc_dir`` is set (without one the values would stay in this
    process), or for a bad `interval_s` / `top`; RuntimeError if the profiler is not
    running; ImportError without ``prometheus_client``.
    """
    if not any(os.environ.get(name) for name in MULTIPROC_ENV):
        raise ValueError("publish_multiprocess needs PROMETHEUS_MULTIPROC_DIR set (prometheus_client's "
                         "multiprocess mode)")
    if not profiler.running:
        raise RuntimeError("publish_multiprocess needs a running profiler")
    import prometheus_client  # noqa: F401  (ImportError before the thread starts)
    return MultiprocessPublisher(profiler, interval_s, top).start()
