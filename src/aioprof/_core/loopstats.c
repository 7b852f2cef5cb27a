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

ap_loop_t *ap_loop_get(ap_session_t *s, PyObject *loop, ap_ns_t now)
{
    ap_loop_t *l = (ap_loop_t *)ap_table_get(&s->loop_idx, (uintptr_t)loop);
    if (l)
        return l;
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

void ap_loop_free(ap_loop_t *l)
{
    Py_XDECREF(l->wr);
    Py_XDECREF(l->type_name);
    ap_hist_free(&l->tick_hist);
    ap_hist_free(&l->handles_hist);
    ap_hist_free(&l->lag_hist);
    ap_hist_free(&l->timer_hist);
    PyMem_RawFree(l);
}

PyObject *ap_loop_died(PyObject *Py_UNUSED(module), PyObject *wr)
{
    ap_session_t *s = ap_session;
    if (!s)
        Py_RETURN_NONE;
    for (uint32_t i = 0; i < s->n_loops; i++) {
        ap_loop_t *l = s->loops[i];
        if (l->wr == wr) {
            /* The address may be reused by a new loop: forget the key, keep the figures. */
            ap_table_del(&s->loop_idx, l->addr);
            l->destroyed = 1;
            Py_CLEAR(l->wr);
            break;
        }
    }
    Py_RETURN_NONE;
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
