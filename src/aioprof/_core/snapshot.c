/* snapshot.c - the session's figures as Python objects (integer ns), as of `now`.
 *
 * Tasks still pending are counted up to `now` without changing the session: the
 * time since their last transition goes to busy, scheduled or idle in the copy
 * that is returned, and a suspended task's current await chain gets its idle. */
#include "profile.h"

#include <stdlib.h>
#include <string.h>

/* Build a dict from alternating key (C string) / value (new reference) pairs; a
 * NULL value fails the whole dict (its error is already set). Steals the values. */
static PyObject *dict_of(int n, ...)
{
    va_list ap;
    va_start(ap, n);
    PyObject *d = PyDict_New();
    for (int i = 0; i < n; i++) {
        const char *k = va_arg(ap, const char *);
        PyObject *v = va_arg(ap, PyObject *);
        if (d && (!v || PyDict_SetItemString(d, k, v) < 0))
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    va_end(ap);
    return d;
}

static PyObject *ns(ap_ns_t v) { return PyLong_FromLongLong(v); }
static PyObject *ns_or_none(ap_ns_t v) { return v < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(v); }
static PyObject *u64(uint64_t v) { return PyLong_FromUnsignedLongLong(v); }

static PyObject *site_obj(ap_session_t *s, uint32_t site)
{
    if (site == AP_NONE)
        return Py_NewRef(Py_None);
    ap_code_t *c = &s->codes[s->sites[site].code];
    return dict_of(3, "file", Py_NewRef(c->filename), "line", PyLong_FromLong(s->sites[site].line),
                   "function", Py_NewRef(c->qualname));
}

/* Where a task was made: its creation site, with the library frame the walk went through
 * to it as "via" (or null); or, made by no frame of the program, what ran (a callback, a
 * task's step) with no line; or null (it existed before profiling). */
static PyObject *created_obj(ap_session_t *s, const ap_task_t *t)
{
    if (t->created == AP_NONE && !t->by_loop)
        return Py_NewRef(Py_None);
    if (t->created == AP_NONE)
        return dict_of(4, "file", Py_NewRef(t->created_by_file ? t->created_by_file : Py_None),
                       "line", Py_NewRef(Py_None), "function", Py_NewRef(t->created_by ? t->created_by : Py_None),
                       "via", Py_NewRef(Py_None));
    PyObject *d = site_obj(s, t->created);
    PyObject *via = site_obj(s, t->created_via);
    if (d && via && PyDict_SetItemString(d, "via", via) < 0)
        Py_CLEAR(d);
    Py_XDECREF(via);
    if (!via)
        Py_CLEAR(d);
    return d;
}

static PyObject *chain_obj(ap_session_t *s, uint32_t chain)
{
    ap_chain_t *c = &s->chains[chain];
    PyObject *list = PyList_New(c->n);
    for (uint32_t i = 0; list && i < c->n; i++) {
        PyObject *o = site_obj(s, c->sites[i]);
        if (!o) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, o);
    }
    return list;
}

typedef struct {
    ap_ns_t busy, scheduled, idle;
} extra_t;

static int cmp_await_idle(const void *a, const void *b)
{
    const ap_await_t *x = a, *y = b;
    return (x->idle < y->idle) - (x->idle > y->idle);
}

/* The await chain a suspended live task sits in now, or AP_NONE. */
static uint32_t current_chain(ap_session_t *s, ap_task_t *t)
{
    if (!t->wr || !t->coro)
        return AP_NONE;
    PyObject *task = ap_weakref_get(t->wr);   /* keeps the coroutine alive during the walk */
    if (!task)
        return AP_NONE;
    uint32_t chain = ap_chain_of(s, t->coro);
    Py_DECREF(task);
    return chain;
}

static PyObject *task_obj(ap_session_t *s, ap_task_t *t, ap_ns_t now, extra_t *cx, ap_ns_t *site_idle,
                          uint64_t *site_count, ap_ns_t *inner_idle, uint64_t *inner_count)
{
    if (t->wr) {
        PyObject *task = ap_weakref_get(t->wr);
        if (task) {
            ap_task_refresh_name(t, task);
            Py_DECREF(task);
        }
    }
    ap_ns_t busy = t->busy, sched = t->scheduled, idle = t->idle, max_step = t->max_step;
    uint32_t n_aw = t->n_awaits;
    ap_await_t *aw = NULL;
    if (t->state == AP_RUNNING) {
        ap_ns_t d = now - t->t_step;
        busy += d;
        if (d > max_step)
            max_step = d;
        if (cx)
            cx->busy += d;
    } else if (t->state == AP_READY) {
        sched += now - t->t_mark;
        if (cx)
            cx->scheduled += now - t->t_mark;
    } else if (t->state == AP_SUSPENDED) {
        ap_ns_t d = now - t->t_mark;
        idle += d;
        if (cx)
            cx->idle += d;
        uint32_t chain = current_chain(s, t);
        if (PyErr_Occurred())
            PyErr_Clear();
        n_aw = t->n_awaits;
        if (chain != AP_NONE) {
            ap_chain_t *c = &s->chains[chain];
            for (uint32_t i = 0; i < c->n; i++) {
                int dup = 0;
                for (uint32_t j = 0; j < i && !dup; j++)
                    dup = c->sites[j] == c->sites[i];
                if (!dup) {
                    site_idle[c->sites[i]] += d;
                    site_count[c->sites[i]]++;
                }
            }
            inner_idle[c->sites[c->n - 1]] += d;
            inner_count[c->sites[c->n - 1]]++;
        }
        aw = PyMem_RawMalloc((n_aw + 1) * sizeof *aw);
        if (!aw)
            return PyErr_NoMemory();
        if (n_aw)   /* awaits is NULL for a task never suspended */
            memcpy(aw, t->awaits, n_aw * sizeof *aw);
        uint32_t i = 0;
        while (chain != AP_NONE && i < n_aw && aw[i].chain != chain)
            i++;
        if (chain != AP_NONE) {
            if (i == n_aw)
                aw[n_aw++] = (ap_await_t){chain, 0, 0};
            aw[i].count++;
            aw[i].idle += d;
        }
    }
    if (!aw) {
        aw = PyMem_RawMalloc((n_aw + 1) * sizeof *aw);
        if (!aw)
            return PyErr_NoMemory();
        if (n_aw)   /* awaits is NULL for a task never suspended */
            memcpy(aw, t->awaits, n_aw * sizeof *aw);
    }
    qsort(aw, n_aw, sizeof *aw, cmp_await_idle);
    PyObject *awaits = PyList_New(0);
    for (uint32_t i = 0; awaits && i < n_aw; i++) {
        ap_chain_t *c = &s->chains[aw[i].chain];
        uint32_t site = c->sites[c->n - 1];
        ap_code_t *code = &s->codes[s->sites[site].code];
        PyObject *o = dict_of(7, "file", Py_NewRef(code->filename), "line", PyLong_FromLong(s->sites[site].line),
                              "function", Py_NewRef(code->qualname), "count", PyLong_FromUnsignedLong(aw[i].count),
                              "idle_ns", ns(aw[i].idle), "chain", chain_obj(s, aw[i].chain),
                              "user_site", site_obj(s, ap_chain_user_site(s, aw[i].chain)));
        if (!o || PyList_Append(awaits, o) < 0)
            Py_CLEAR(awaits);
        Py_XDECREF(o);
    }
    PyMem_RawFree(aw);
    if (!awaits)
        return NULL;

    static const char *const states[] = {"pending", "done", "cancelled", "failed"};
    PyObject *coro_name, *file, *line;
    if (t->coro_idx != AP_NONE) {
        ap_code_t *c = &s->codes[s->coros[t->coro_idx].code];
        coro_name = Py_NewRef(c->qualname);
        file = Py_NewRef(c->filename);
        line = PyLong_FromLong(c->firstlineno);
    } else {
        coro_name = t->coro_name ? Py_NewRef(t->coro_name) : PyUnicode_FromString("<awaitable>");
        file = PyUnicode_FromString("");
        line = PyLong_FromLong(0);
    }
    return dict_of(23, "id", u64(t->id), "name", Py_NewRef(t->name), "coroutine", coro_name, "file", file,
                   "line", line, "created_at", created_obj(s, t),
                   "parent", t->parent ? u64(t->parent) : Py_NewRef(Py_None),
                   "state", PyUnicode_FromString(states[t->result]),
                   "exception", t->exc_name ? Py_NewRef(t->exc_name) : Py_NewRef(Py_None),
                   "internal", PyBool_FromLong(t->internal), "steps", u64(t->steps), "yields", u64(t->yields),
                   "busy_ns", ns(busy), "cpu_ns", ns(t->cpu), "scheduled_ns", ns(sched), "idle_ns", ns(idle),
                   "max_step_ns", ns(max_step), "start_ns", ns(t->t_created - s->t0),
                   "first_step_ns", ns_or_none(t->t_first < 0 ? -1 : t->t_first - s->t0),
                   "end_ns", ns_or_none(t->t_end < 0 ? -1 : t->t_end - s->t0),
                   "thread", PyLong_FromUnsignedLong(t->thread), "destroyed", PyBool_FromLong(t->destroyed),
                   "await_sites", awaits);
}

static PyObject *slow_obj(ap_session_t *s, const ap_slow_t *r)
{
    PyObject *coro = Py_NewRef(Py_None), *cb = Py_NewRef(Py_None);
    if (r->coro != AP_NONE) {
        Py_SETREF(coro, Py_NewRef(s->codes[s->coros[r->coro].code].qualname));
    }
    if (r->cb != AP_NONE)
        Py_SETREF(cb, Py_NewRef(s->cbs[r->cb].name));
    const char *kind = r->is_tick ? "tick" : r->cb != AP_NONE ? "callback" : "step";
    return dict_of(10, "kind", PyUnicode_FromString(kind), "duration_ns", ns(r->dur),
                   "at_ns", ns(r->at), "task", r->task ? u64(r->task) : Py_NewRef(Py_None),
                   "coroutine", coro, "callback", cb, "step_start", site_obj(s, r->site_start),
                   "step_end", site_obj(s, r->site_end),
                   "blocked_at", site_obj(s, r->site_block1 ? r->site_block1 - 1 : AP_NONE),
                   "handles", PyLong_FromUnsignedLong(r->handles));
}

static int cmp_slow(const void *a, const void *b)
{
    const ap_slow_t *x = a, *y = b;
    return (x->dur < y->dur) - (x->dur > y->dur);
}

static PyObject *loop_fields(ap_session_t *s, ap_loop_t *l, int with_slow);

/* A loop, or a group of folded ended loops (l->folded > 0: no id, thread name and class
 * identify it, "loops" counts them). */
static PyObject *loop_obj(ap_session_t *s, ap_loop_t *l, int with_slow)
{
    PyObject *d = loop_fields(s, l, with_slow);
    if (!d)
        return NULL;
    PyObject *tname = l->thread_name ? l->thread_name : Py_None, *mod = l->module ? l->module : Py_None;
    if (PyDict_SetItemString(d, "thread_name", tname) < 0 || PyDict_SetItemString(d, "module", mod) < 0)
        Py_CLEAR(d);
    if (d && l->folded) {
        PyObject *n = u64(l->folded);
        if (!n || PyDict_SetItemString(d, "loops", n) < 0 || PyDict_DelItemString(d, "id") < 0 ||
            PyDict_DelItemString(d, "destroyed") < 0 || PyDict_SetItemString(d, "load_smoothed", Py_None) < 0 ||
            (!l->thread_name && PyDict_SetItemString(d, "thread", Py_None) < 0))
            Py_CLEAR(d);
        Py_XDECREF(n);
    }
    return d;
}

static PyObject *loop_fields(ap_session_t *s, ap_loop_t *l, int with_slow)
{
    ap_slow_t sorted[AP_SLOW_KEEP];
    uint32_t n_slow = with_slow ? l->n_slow : 0;
    memcpy(sorted, l->slow, n_slow * sizeof *sorted);
    qsort(sorted, n_slow, sizeof *sorted, cmp_slow);
    PyObject *slow = PyList_New(0);
    for (uint32_t i = 0; slow && i < n_slow; i++) {
        PyObject *o = slow_obj(s, &sorted[i]);
        if (!o || PyList_Append(slow, o) < 0)
            Py_CLEAR(slow);
        Py_XDECREF(o);
    }
    if (l->uvloop) {
        /* uvloop runs its ticks and select in Cython: those figures are unavailable,
         * which is null, never 0. Task steps, their lag and slow steps are measured; busy
         * is the time inside task steps, utilization that over the span from the first
         * call_soon to the end of the last step. */
        PyObject *none = Py_None;
        ap_ns_t span = l->last_tick_end - l->first_seen;
        PyObject *util = span > 0 && !l->folded ? PyFloat_FromDouble((double)l->step_busy / (double)span)
                                                : Py_NewRef(none);   /* a group's spans hold the gaps */
        return dict_of(27, "id", u64(l->id), "type", Py_NewRef(l->type_name),
                       "thread", PyLong_FromUnsignedLong(l->thread), "ticks", Py_NewRef(none),
                       "handles", u64(l->handles), "select_calls", Py_NewRef(none),
                       "io_events", Py_NewRef(none), "wall_ns", Py_NewRef(none), "select_wait_ns", Py_NewRef(none),
                       "busy_ns", ns(l->step_busy), "utilization", util, "load", Py_NewRef(none),
                       "load_smoothed", Py_NewRef(none),
                       "lag_p50_ns", ns(ap_hist_quantile(&l->lag_hist, 0.5)),
                       "lag_p90_ns", ns(ap_hist_quantile(&l->lag_hist, 0.9)),
                       "lag_p99_ns", ns(ap_hist_quantile(&l->lag_hist, 0.99)),
                       "lag_max_ns", ns(l->lag_hist.max), "lag_count", u64(l->lag_hist.count),
                       "timer_lag_p99_ns", Py_NewRef(none), "timer_lag_max_ns", Py_NewRef(none),
                       "tick_busy_p50_ns", Py_NewRef(none), "tick_busy_p99_ns", Py_NewRef(none),
                       "tick_busy_max_ns", Py_NewRef(none), "handles_per_tick_max", Py_NewRef(none),
                       "slow_steps", slow, "slow_total", u64(l->slow_total),
                       "destroyed", PyBool_FromLong(l->destroyed));
    }
    double wall = (double)l->wall;
    ap_ns_t busy = l->wall - l->select_wait;
    PyObject *util = wall > 0 ? PyFloat_FromDouble((double)busy / wall) : Py_NewRef(Py_None);
    PyObject *load = wall > 0 ? PyFloat_FromDouble(1.0 - (double)l->select_capped / wall) : Py_NewRef(Py_None);
    return dict_of(29, "id", u64(l->id), "type", Py_NewRef(l->type_name),
                   "thread", PyLong_FromUnsignedLong(l->thread), "ticks", u64(l->ticks),
                   "handles", u64(l->handles), "select_calls", u64(l->select_calls),
                   "io_events", u64(l->io_events), "wall_ns", ns(l->wall), "select_wait_ns", ns(l->select_wait),
                   "busy_ns", ns(busy), "utilization", util, "load", load,
                   "load_smoothed", PyFloat_FromDouble(l->load_ewma),
                   "lag_p50_ns", ns(ap_hist_quantile(&l->lag_hist, 0.5)),
                   "lag_p90_ns", ns(ap_hist_quantile(&l->lag_hist, 0.9)),
                   "lag_p99_ns", ns(ap_hist_quantile(&l->lag_hist, 0.99)),
                   "lag_max_ns", ns(l->lag_hist.max), "lag_count", u64(l->lag_hist.count),
                   "timer_lag_p99_ns", ns(ap_hist_quantile(&l->timer_hist, 0.99)),
                   "timer_lag_max_ns", ns(l->timer_hist.max),
                   "tick_busy_p50_ns", ns(ap_hist_quantile(&l->tick_hist, 0.5)),
                   "tick_busy_p99_ns", ns(ap_hist_quantile(&l->tick_hist, 0.99)),
                   "tick_busy_max_ns", ns(l->tick_hist.max),
                   "handles_per_tick_max", u64((uint64_t)l->handles_hist.max),
                   "handles_per_tick_p50", u64((uint64_t)ap_hist_quantile(&l->handles_hist, 0.5)),
                   "handles_per_tick_p99", u64((uint64_t)ap_hist_quantile(&l->handles_hist, 0.99)),
                   "slow_steps", slow, "slow_total", u64(l->slow_total),
                   "destroyed", PyBool_FromLong(l->destroyed));
}

/* The coroutine records 0..n-1, with the pending time of their live tasks (cx[i]) added. */
static PyObject *coros_list(ap_session_t *s, uint32_t n, const extra_t *cx)
{
    PyObject *coros = PyList_New(0);
    for (uint32_t i = 0; coros && i < n && i < s->n_coros; i++) {
        ap_coro_t *c = &s->coros[i];
        ap_code_t *code = &s->codes[c->code];
        PyObject *o = dict_of(14, "slow_steps", u64(c->slow), "coroutine", Py_NewRef(code->qualname),
                              "file", Py_NewRef(code->filename),
                              "line", PyLong_FromLong(code->firstlineno), "internal", PyBool_FromLong(code->is_internal),
                              "tasks", u64(c->tasks), "steps", u64(c->steps), "busy_ns", ns(c->busy + cx[i].busy),
                              "cpu_ns", ns(c->cpu), "scheduled_ns", ns(c->scheduled + cx[i].scheduled),
                              "idle_ns", ns(c->idle + cx[i].idle), "max_step_ns", ns(c->max_step),
                              "p50_step_ns", ns(ap_hist_quantile(&c->hist, 0.5)),
                              "p99_step_ns", ns(ap_hist_quantile(&c->hist, 0.99)));
        if (!o || PyList_Append(coros, o) < 0)
            Py_CLEAR(coros);
        Py_XDECREF(o);
    }
    return coros;
}

static PyObject *loop_full(ap_session_t *s, ap_loop_t *l) { return loop_obj(s, l, 1); }

/* A list of obj(loop) for each loop (groups: each folded group). The array is read
 * afresh at every step: a hook run meanwhile (another thread's) may have grown it. */
static PyObject *loops_list(ap_session_t *s, int groups, PyObject *(*obj)(ap_session_t *, ap_loop_t *))
{
    PyObject *list = PyList_New(0);
    for (uint32_t i = 0; list && i < (groups ? s->n_loop_groups : s->n_loops); i++) {
        PyObject *o = obj(s, groups ? s->loop_groups[i] : s->loops[i]);
        if (!o || PyList_Append(list, o) < 0)
            Py_CLEAR(list);
        Py_XDECREF(o);
    }
    return list;
}

static PyObject *metrics_loop(ap_session_t *s, ap_loop_t *l);
static PyObject *metrics_copy(ap_session_t *s, ap_ns_t now);

PyObject *ap_snapshot(ap_session_t *s, ap_ns_t now)
{
    PyObject *tasks = NULL, *coros = NULL, *cbs = NULL, *sites = NULL, *loops = NULL, *folded = NULL, *res = NULL;
    uint32_t n_sites0 = s->n_sites;
    /* Walking current chains may add sites, so size the scratch arrays generously and
     * walk before reading site totals. */
    size_t cap = (size_t)s->n_sites + (size_t)s->n_tasks * AP_MAX_CHAIN + 16;
    (void)n_sites0;
    extra_t *cx = PyMem_RawCalloc(s->n_coros + 1, sizeof *cx);
    ap_ns_t *site_idle = PyMem_RawCalloc(cap, sizeof(ap_ns_t)), *inner_idle = PyMem_RawCalloc(cap, sizeof(ap_ns_t));
    uint64_t *site_count = PyMem_RawCalloc(cap, sizeof(uint64_t)), *inner_count = PyMem_RawCalloc(cap, sizeof(uint64_t));
    if (!cx || !site_idle || !inner_idle || !site_count || !inner_count) {
        PyErr_NoMemory();
        goto done;
    }

    /* Tasks: the kept records, then live records that were not kept (their pending
     * time still belongs to their coroutine's totals). */
    tasks = PyList_New(0);
    for (uint32_t i = 0; tasks && i < s->n_tasks; i++) {
        ap_task_t *t = s->tasks[i];
        if (s->n_sites + AP_MAX_CHAIN >= cap)
            break;   /* cannot happen: every task adds at most one chain's sites */
        PyObject *o = task_obj(s, t, now, t->coro_idx != AP_NONE ? &cx[t->coro_idx] : NULL, site_idle,
                               site_count, inner_idle, inner_count);
        if (!o || PyList_Append(tasks, o) < 0)
            Py_CLEAR(tasks);
        Py_XDECREF(o);
    }
    if (!tasks)
        goto done;
    for (size_t i = 0; i < s->live.cap; i++) {
        ap_task_t *t = (ap_task_t *)s->live.vals[i];
        if (!s->live.keys[i] || !t || t->kept || t->coro_idx == AP_NONE)
            continue;
        extra_t *e = &cx[t->coro_idx];
        if (t->state == AP_RUNNING)
            e->busy += now - t->t_step;
        else if (t->state == AP_READY)
            e->scheduled += now - t->t_mark;
        else if (t->state == AP_SUSPENDED)
            e->idle += now - t->t_mark;
    }

    coros = coros_list(s, s->n_coros, cx);
    if (!coros)
        goto done;

    cbs = PyList_New(0);
    for (uint32_t i = 0; cbs && i < s->n_cbs; i++) {
        ap_cb_t *c = &s->cbs[i];
        PyObject *file = Py_NewRef(Py_None), *line = Py_NewRef(Py_None);
        if (c->code != AP_NONE) {
            Py_SETREF(file, Py_NewRef(s->codes[c->code].filename));
            Py_SETREF(line, PyLong_FromLong(s->codes[c->code].firstlineno));
        }
        PyObject *o = dict_of(9, "slow_steps", u64(c->slow), "callback", Py_NewRef(c->name), "file", file,
                              "line", line,
                              "internal", PyBool_FromLong(c->internal), "count", u64(c->count),
                              "busy_ns", ns(c->busy), "cpu_ns", ns(c->cpu), "max_step_ns", ns(c->max_step));
        if (!o || PyList_Append(cbs, o) < 0)
            Py_CLEAR(cbs);
        Py_XDECREF(o);
    }
    if (!cbs)
        goto done;

    sites = PyList_New(0);
    for (uint32_t i = 0; sites && i < s->n_sites && i < cap; i++) {
        ap_site_t *st = &s->sites[i];
        uint64_t count = st->count + site_count[i];
        if (count == 0 && st->slow == 0)
            continue;   /* creation sites and lines never suspended at */
        ap_code_t *code = &s->codes[st->code];
        PyObject *o = dict_of(9, "slow_steps", u64(st->slow), "file", Py_NewRef(code->filename), "line", PyLong_FromLong(st->line),
                              "function", Py_NewRef(code->qualname), "internal", PyBool_FromLong(code->is_asyncio),
                              "count", u64(count), "idle_ns", ns(st->idle + site_idle[i]),
                              "innermost_count", u64(st->inner_count + inner_count[i]),
                              "innermost_idle_ns", ns(st->inner_idle + inner_idle[i]));
        if (!o || PyList_Append(sites, o) < 0)
            Py_CLEAR(sites);
        Py_XDECREF(o);
    }
    if (!sites)
        goto done;

    ap_loop_sweep(s, 1);
    loops = loops_list(s, 0, loop_full);
    folded = loops_list(s, 1, loop_full);
    if (!loops || !folded)
        goto done;

    res = dict_of(9, "wall_ns", ns((s->t_stop ? s->t_stop : now) - s->t0), "cpu_window_ns", ns(s->cpu_window),
                  "slow_ns", ns(s->slow_ns), "dropped_tasks", u64(s->dropped),
                  "warnings", PySequence_List(s->faults), "tasks", Py_NewRef(tasks),
                  "coroutines", Py_NewRef(coros), "callbacks", Py_NewRef(cbs),
                  "sites", Py_NewRef(sites));
    if (res && (PyDict_SetItemString(res, "loops", loops) < 0 || PyDict_SetItemString(res, "loops_folded", folded) < 0 ||
                ap_stacks_snapshot(s, res) < 0 ||
                ap_trace_snapshot(s, res) < 0))
        Py_CLEAR(res);
done:
    Py_XDECREF(tasks);
    Py_XDECREF(coros);
    Py_XDECREF(cbs);
    Py_XDECREF(sites);
    Py_XDECREF(loops);
    Py_XDECREF(folded);
    PyMem_RawFree(cx);
    PyMem_RawFree(site_idle);
    PyMem_RawFree(inner_idle);
    PyMem_RawFree(site_count);
    PyMem_RawFree(inner_count);
    return res;
}

/* ------------------------------------------------------------------ metrics */

/* A histogram's non-empty buckets as [(upper bound ns, count), ...]: the bucket holds the
 * values from the previous bucket's bound up to (not including) its own. */
static PyObject *hist_buckets(const ap_hist_t *h)
{
    PyObject *list = PyList_New(0);
    for (int i = 0; list && h->b && i < AP_HIST_BUCKETS; i++) {
        if (!h->b[i])
            continue;
        PyObject *o = Py_BuildValue("(LI)", (long long)ap_hist_lower(i + 1), (unsigned)h->b[i]);
        if (!o || PyList_Append(list, o) < 0)
            Py_CLEAR(list);
        Py_XDECREF(o);
    }
    return list;
}

/* A loop or a folded group, as loop_obj without its slow steps, plus its lag histogram:
 * lag_buckets, lag_sum_ns (lag_count is there already). */
static PyObject *metrics_loop(ap_session_t *s, ap_loop_t *l)
{
    PyObject *d = loop_obj(s, l, 0);
    if (!d)
        return NULL;
    PyObject *b = hist_buckets(&l->lag_hist), *sum = ns(l->lag_hist.sum);
    if (!b || !sum || PyDict_SetItemString(d, "lag_buckets", b) < 0 || PyDict_SetItemString(d, "lag_sum_ns", sum) < 0 ||
        PyDict_DelItemString(d, "slow_steps") < 0)
        Py_CLEAR(d);
    Py_XDECREF(b);
    Py_XDECREF(sum);
    return d;
}

PyObject *ap_metrics(ap_session_t *s, ap_ns_t now)
{
    /* Called from a scrape's thread while the loops run in theirs: after the sweep (which
     * calls is_closed(), Python code), no Python code may run until the copy is done, or
     * the GIL could pass to a loop's thread whose hooks change the tables under it. So
     * the cyclic GC (finalizers) is off meanwhile: making ints, dicts and lists runs none. */
    ap_loop_sweep(s, 1);
    int gc_was_on = PyGC_Disable();
    PyObject *res = metrics_copy(s, now);
    if (gc_was_on)
        PyGC_Enable();
    return res;
}

static PyObject *metrics_copy(ap_session_t *s, ap_ns_t now)
{
    /* The pending time of live tasks, per coroutine, and their states. */
    uint32_t n_coros = s->n_coros;
    extra_t *cx = PyMem_RawCalloc(n_coros + 1, sizeof *cx);
    if (!cx)
        return PyErr_NoMemory();
    uint64_t running = 0, ready = 0, suspended = 0;
    for (size_t i = 0; i < s->live.cap; i++) {
        ap_task_t *t = (ap_task_t *)s->live.vals[i];
        if (!s->live.keys[i] || !t)
            continue;
        extra_t *e = t->coro_idx < n_coros ? &cx[t->coro_idx] : &cx[n_coros];
        if (t->state == AP_RUNNING) {
            running++;
            e->busy += now - t->t_step;
        } else if (t->state == AP_READY) {
            ready++;
            e->scheduled += now - t->t_mark;
        } else if (t->state == AP_SUSPENDED) {
            suspended++;
            e->idle += now - t->t_mark;
        }
    }
    PyObject *coros = coros_list(s, n_coros, cx), *loops = NULL, *folded = NULL, *res = NULL;
    PyMem_RawFree(cx);
    if (!coros)
        return NULL;
    loops = loops_list(s, 0, metrics_loop);
    folded = loops_list(s, 1, metrics_loop);
    if (loops && folded) {
        PyObject *states = Py_BuildValue("{s:K,s:K,s:K}", "running", (unsigned long long)running, "scheduled",
                                         (unsigned long long)ready, "idle", (unsigned long long)suspended);
        PyObject *ended = Py_BuildValue("{s:K,s:K,s:K,s:K}", "done", (unsigned long long)s->tasks_ended[AP_R_DONE],
                                        "cancelled", (unsigned long long)s->tasks_ended[AP_R_CANCELLED],
                                        "failed", (unsigned long long)s->tasks_ended[AP_R_FAILED],
                                        "destroyed", (unsigned long long)s->tasks_ended[4]);
        res = dict_of(7, "wall_ns", ns((s->t_stop ? s->t_stop : now) - s->t0), "slow_ns", ns(s->slow_ns),
                      "tasks_now", states, "tasks_ended", ended, "coroutines", Py_NewRef(coros),
                      "loops", Py_NewRef(loops), "loops_folded", Py_NewRef(folded));
    }
    Py_DECREF(coros);
    Py_XDECREF(loops);
    Py_XDECREF(folded);
    return res;
}
