/* loopstats.c - per event loop: ticks, select wait, load, lag and slow steps.
 *
 * The load follows the asyncio loop-instrumentation proposal: time blocked in
 * select() counts as idle only up to the timeout select was given; time past the
 * timeout means the process was not scheduled, so it counts as busy. Utilization is
 * the plain form, busy = wall - select wait (libuv's uv_metrics_idle_time model). */
#include "profile.h"

#include <math.h>
#include <string.h>

#define LOAD_TAU_NS 1000000000.0   /* the smoothed load forgets with a 1 s time constant */

static PyObject *str_threading(void)
{
    static PyObject *name;
    if (!name)
        name = PyUnicode_InternFromString("threading");
    return name;
}

/* The name of the calling thread as threading knows it (new ref), or NULL. Read from
 * threading._active: current_thread() would register a dummy thread for a thread
 * threading did not start, which the program could see. */
static PyObject *thread_name_now(void)
{
    PyObject *mod = PyImport_GetModule(str_threading());
    PyObject *active = mod ? PyObject_GetAttrString(mod, "_active") : NULL;
    PyObject *key = active ? PyLong_FromUnsignedLong(PyThread_get_thread_ident()) : NULL;
    PyObject *th = key && PyDict_Check(active) ? PyDict_GetItemWithError(active, key) : NULL;
    PyObject *name = th ? PyObject_GetAttrString(th, "name") : NULL;
    if (name && !PyUnicode_Check(name))
        Py_CLEAR(name);
    Py_XDECREF(mod);
    Py_XDECREF(active);
    Py_XDECREF(key);
    PyErr_Clear();
    return name;
}

ap_loop_t *ap_loop_get(ap_session_t *s, PyObject *loop, ap_ns_t now)
{
    ap_loop_t *l = (ap_loop_t *)ap_table_get(&s->loop_idx, (uintptr_t)loop);
    if (l)
        return l;
    ap_loop_sweep(s, 1);   /* a new loop: the program may have closed earlier ones */
    if (s->n_loops == s->cap_loops) {
        uint32_t ncap = s->cap_loops ? s->cap_loops * 2 : 8;
        ap_loop_t **p = PyMem_RawRealloc(s->loops, ncap * sizeof *p);
        if (!p) {
            PyErr_NoMemory();
            return NULL;
        }
        s->loops = p;
        s->cap_loops = ncap;
    }
    l = PyMem_RawCalloc(1, sizeof *l);
    if (!l) {
        PyErr_NoMemory();
        return NULL;
    }
    l->id = ++s->next_loop_id;
    l->addr = (uintptr_t)loop;
    l->thread = PyThread_get_thread_ident();
    l->first_seen = now;
    l->type_name = PyUnicode_FromString(_PyType_Name(Py_TYPE(loop)));
    l->module = PyObject_GetAttrString((PyObject *)Py_TYPE(loop), "__module__");
    if (l->module && !PyUnicode_Check(l->module))
        Py_CLEAR(l->module);
    PyErr_Clear();
    l->thread_name = thread_name_now();
    /* Timer due times are comparable with aioprof's clock only when the loop keeps
     * time with time.monotonic(), i.e. BaseEventLoop.time is not overridden. */
    PyObject *mine = PyObject_GetAttrString((PyObject *)Py_TYPE(loop), "time");
    PyObject *base = PyObject_GetAttrString((PyObject *)Py_TYPE(loop)->tp_base, "time");
    PyObject *mod = PyImport_ImportModule("asyncio.base_events");
    PyObject *bel = mod ? PyObject_GetAttrString(mod, "BaseEventLoop") : NULL;
    PyObject *bt = bel ? PyObject_GetAttrString(bel, "time") : NULL;
    l->real_time = mine && bt && mine == bt && !ap_clock_is_fake();
    Py_XDECREF(mine);
    Py_XDECREF(base);
    Py_XDECREF(mod);
    Py_XDECREF(bel);
    Py_XDECREF(bt);
    l->wr = l->type_name ? PyWeakref_NewRef(loop, s->wr_loop_cb) : NULL;
    if (!l->wr || ap_table_put(&s->loop_idx, l->addr, (uintptr_t)l) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        ap_loop_free(l);
        return NULL;
    }
    s->loops[s->n_loops++] = l;
    return l;
}

/* The loop object is gone or closed: it will run no more handles. */
static void loop_ended(ap_session_t *s, ap_loop_t *l)
{
    /* The address may be reused by a new loop: forget the key, keep the figures. */
    ap_table_del(&s->loop_idx, l->addr);
    l->destroyed = 1;
    Py_CLEAR(l->wr);   /* its callback will not run now */
    PyMem_RawFree(l->ring);
    l->ring = NULL;
    l->ring_len = l->ring_head = 0;
}

PyObject *ap_loop_died(PyObject *Py_UNUSED(module), PyObject *wr)
{
    ap_session_t *s = ap_session;
    if (!s)
        Py_RETURN_NONE;
    for (uint32_t i = 0; i < s->n_loops; i++) {
        ap_loop_t *l = s->loops[i];
        if (l->wr == wr) {
            loop_ended(s, l);
            break;
        }
    }
    ap_loop_sweep(s, 0);
    Py_RETURN_NONE;
}

/* ---- folding ended loops into groups: bounded memory for a loop per call ---- */

static int same_str(PyObject *a, PyObject *b)
{
    if (!a || !b)
        return a == b;
    int eq = PyObject_RichCompareBool(a, b, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq == 1;
}

/* What decides which ended loops stay in full: the time they were busy. */
static ap_ns_t loop_size(const ap_loop_t *l)
{
    return l->wall - l->select_wait + l->step_busy;
}

/* The group of (thread name, class) for `l`, created if new; NULL on no memory. Past
 * AP_LOOP_GROUPS groups, loops of new thread names share one group per class whose
 * thread name is NULL ("other threads"). */
static ap_loop_t *group_of(ap_session_t *s, const ap_loop_t *l)
{
    PyObject *tname = l->thread_name;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < s->n_loop_groups; i++) {
            ap_loop_t *g = s->loop_groups[i];
            if (same_str(g->thread_name, tname) && same_str(g->type_name, l->type_name) &&
                same_str(g->module, l->module) && g->uvloop == l->uvloop)
                return g;
        }
        if (s->n_loop_groups < AP_LOOP_GROUPS || !tname)
            break;
        tname = NULL;   /* full: the class's "other threads" group */
    }
    if (ap_grow((void **)&s->loop_groups, &s->cap_loop_groups, sizeof *s->loop_groups, s->n_loop_groups) < 0)
        return NULL;
    ap_loop_t *g = PyMem_RawCalloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->type_name = Py_XNewRef(l->type_name);
    g->module = Py_XNewRef(l->module);
    g->thread_name = Py_XNewRef(tname);
    g->thread = tname ? l->thread : 0;
    g->uvloop = l->uvloop;
    g->destroyed = 1;
    g->first_seen = l->first_seen;
    s->loop_groups[s->n_loop_groups++] = g;
    return g;
}

/* Add the figures of ended loop `l` to its group. 0, or -1 on no memory. */
static int fold(ap_session_t *s, ap_loop_t *l)
{
    ap_loop_t *g = group_of(s, l);
    if (!g)
        return -1;
    if (ap_hist_merge(&g->tick_hist, &l->tick_hist) < 0 || ap_hist_merge(&g->handles_hist, &l->handles_hist) < 0 ||
        ap_hist_merge(&g->lag_hist, &l->lag_hist) < 0 || ap_hist_merge(&g->timer_hist, &l->timer_hist) < 0)
        return -1;
    g->folded++;
    g->ticks += l->ticks;
    g->handles += l->handles;
    g->select_calls += l->select_calls;
    g->io_events += l->io_events;
    g->wall += l->wall;
    g->select_wait += l->select_wait;
    g->select_capped += l->select_capped;
    g->overhead_cpu += l->overhead_cpu;
    g->step_busy += l->step_busy;
    g->slow_total += l->slow_total;
    if (l->first_seen < g->first_seen)
        g->first_seen = l->first_seen;
    if (l->last_tick_end > g->last_tick_end)
        g->last_tick_end = l->last_tick_end;
    for (uint32_t i = 0; i < l->n_slow; i++) {   /* the longest, as ap_loop_slow keeps them */
        if (g->n_slow < AP_SLOW_KEEP) {
            g->slow[g->n_slow++] = l->slow[i];
            continue;
        }
        uint32_t lo = 0;
        for (uint32_t j = 1; j < g->n_slow; j++)
            if (g->slow[j].dur < g->slow[lo].dur)
                lo = j;
        if (l->slow[i].dur > g->slow[lo].dur)
            g->slow[lo] = l->slow[i];
    }
    /* CPU windows not read yet that would charge the loop's overhead: to the group. */
    for (ap_thread_t *th = s->threads; th; th = th->next)
        for (uint32_t i = 0; i < th->n_pending; i++)
            if (th->pending[i].loop == l)
                th->pending[i].loop = g;
    return 0;
}

void ap_loop_sweep(ap_session_t *s, int check_closed)
{
    /* Not re-entered: the is_closed() calls below allocate, a collection they start can
     * kill a loop, and its weak-reference callback sweeps too (it only marks the loop). */
    static int sweeping;
    if (sweeping)
        return;
    sweeping = 1;
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    uint32_t ended = 0;
    for (uint32_t i = 0; i < s->n_loops; i++) {
        ap_loop_t *l = s->loops[i];
        if (!l->destroyed && check_closed) {
            /* Closed but still referenced (a test suite keeping its loops): ended too. A
             * closed loop runs nothing again (run_forever and call_soon raise). */
            PyObject *loop = ap_weakref_get(l->wr);
            PyObject *closed = loop ? PyObject_CallMethod(loop, "is_closed", NULL) : NULL;
            if (closed && PyObject_IsTrue(closed) == 1 && !l->destroyed)
                loop_ended(s, l);
            Py_XDECREF(closed);
            Py_XDECREF(loop);
            PyErr_Clear();
        }
    }
    for (uint32_t i = 0; i < s->n_loops; i++)
        ended += s->loops[i]->destroyed;
    while (ended > AP_LOOPS_ENDED_KEEP) {
        /* Fold the smallest ended loop; the biggest AP_LOOPS_ENDED_KEEP stay in full. */
        uint32_t pick = UINT32_MAX;
        for (uint32_t i = 0; i < s->n_loops; i++)
            if (s->loops[i]->destroyed && (pick == UINT32_MAX || loop_size(s->loops[i]) < loop_size(s->loops[pick])))
                pick = i;
        ap_loop_t *l = s->loops[pick];
        if (fold(s, l) < 0) {
            ap_fault(s, "out of memory folding an ended event loop");
            break;
        }
        memmove(&s->loops[pick], &s->loops[pick + 1], (s->n_loops - pick - 1) * sizeof *s->loops);
        s->n_loops--;
        s->loops_folded++;
        ap_loop_free(l);
        ended--;
    }
    ap_exc_restore(&exc);
    sweeping = 0;
}

void ap_loop_tick_end(ap_session_t *s, ap_thread_t *th, ap_loop_t *l, ap_ns_t t0, ap_ns_t t1)
{
    ap_ns_t dur = t1 - t0;
    l->ticks++;
    l->wall += dur;
    l->handles += th->tick_handles;
    l->last_tick_end = t1;
    ap_ns_t busy = dur - th->tick_select;
    if (ap_hist_add(&l->tick_hist, busy) < 0 || ap_hist_add(&l->handles_hist, th->tick_handles) < 0)
        ap_fault(s, "out of memory in a histogram");
    if (dur > 0) {
        /* The smoothed load: this tick's busy share, select capped at its timeout. */
        double decay = exp(-(double)dur / LOAD_TAU_NS);
        double tick_load = 1.0 - (double)th->tick_capped / (double)dur;
        if (tick_load < 0)
            tick_load = 0;
        l->load_ewma = l->load_ewma * decay + tick_load * (1.0 - decay);
    }
    if (busy >= s->slow_ns && th->tick_handles > 1) {
        ap_slow_t rec = {.dur = busy, .coro = AP_NONE, .cb = AP_NONE, .site_start = AP_NONE,
                         .site_end = AP_NONE, .handles = th->tick_handles, .is_tick = 1,
                         .at = t0 - s->t0};
        ap_loop_slow(s, l, &rec);
    }
}

void ap_loop_select(ap_session_t *Py_UNUSED(s), ap_loop_t *l, ap_ns_t t0, ap_ns_t t1, ap_ns_t timeout,
                    Py_ssize_t events)
{
    ap_ns_t wait = t1 - t0;
    l->select_calls++;
    l->select_wait += wait;
    if (events > 0)
        l->io_events += (uint64_t)events;
    /* timeout < 0 means "no timeout" (None): the whole wait is idle. */
    l->select_capped += (timeout >= 0 && wait > timeout) ? timeout : wait;
}

void ap_loop_lag(ap_loop_t *l, ap_ns_t lag, int timer)
{
    if (lag < 0)
        lag = 0;
    ap_hist_add(&l->lag_hist, lag);
    if (timer)
        ap_hist_add(&l->timer_hist, lag);
}

void ap_loop_slow(ap_session_t *s, ap_loop_t *l, const ap_slow_t *rec)
{
    l->slow_total++;
    /* Exact counts per coroutine, callback and line; the list below keeps the longest. */
    if (rec->coro != AP_NONE)
        s->coros[rec->coro].slow++;
    if (rec->cb != AP_NONE)
        s->cbs[rec->cb].slow++;
    if (rec->site_end != AP_NONE)
        s->sites[rec->site_end].slow++;
    if (l->n_slow < AP_SLOW_KEEP) {
        l->slow[l->n_slow++] = *rec;
        return;
    }
    /* Full: keep the longest, replacing the shortest kept. */
    uint32_t lo = 0;
    for (uint32_t i = 1; i < l->n_slow; i++)
        if (l->slow[i].dur < l->slow[lo].dur)
            lo = i;
    if (rec->dur > l->slow[lo].dur)
        l->slow[lo] = *rec;
}

/* The ring mirrors the order in which plain (non-task) handles enter the loop's
 * ready queue through _call_soon. The loop runs its ready queue in FIFO order, so
 * the handle being run is the oldest ring entry unless entries before it belong to
 * handles that were cancelled (the loop skips them); those are dropped on the way.
 * A handle not in the ring at all (an I/O callback queued by _process_events) is
 * recognised by the ring running dry. */
void ap_loop_ring_push(ap_loop_t *l, uintptr_t handle, ap_ns_t ready)
{
    if (!l->ring && !(l->ring = PyMem_RawMalloc(AP_RING * sizeof *l->ring)))
        return;   /* no memory: its lag is not measured (ring_pop answers -1) */
    if (l->ring_len == AP_RING) {   /* full: forget the oldest */
        l->ring_head = (l->ring_head + 1) % AP_RING;
        l->ring_len--;
    }
    l->ring[(l->ring_head + l->ring_len) % AP_RING] = (ap_ready_t){handle, ready};
    l->ring_len++;
}

ap_ns_t ap_loop_ring_pop(ap_loop_t *l, uintptr_t handle)
{
    for (uint32_t i = 0; i < l->ring_len; i++) {
        if (l->ring[(l->ring_head + i) % AP_RING].handle == handle) {
            ap_ns_t ready = l->ring[(l->ring_head + i) % AP_RING].ready;
            l->ring_head = (l->ring_head + i + 1) % AP_RING;
            l->ring_len -= i + 1;
            return ready;
        }
        if (i >= 64)
            break;   /* not near the front: an I/O handle; keep the ring as it is */
    }
    return -1;
}
