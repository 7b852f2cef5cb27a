/* monitor.c - loop monitors: the loop events for observers, and a loop's load.
 *
 * A monitor watches one event loop and works with or without a profiling session:
 * the hooks stay installed while either exists (module.c's monitor_add and monitor_close
 * take and drop a reference on them, ap_hooks_acquire/release). Its figures
 * are computed here in C; Python observers are called only for the monitors that have
 * some, with the event names of the asyncio loop-instrumentation proposal:
 * loop_start(), tick_start(), io_start(timeout), io_end(timeout, events),
 * tick_end(handles), loop_stop(). An exception from an observer is reported with
 * sys.unraisablehook and never reaches the loop.
 *
 * uvloop runs its ticks and select in compiled code, so it has none of those events:
 * there the busy time is the time inside its task steps (timed through the call_soon
 * hook, hooks.c), everything else is idle, and the load is that share, smoothed the
 * same way. Starvation (select sleeping past its timeout) cannot be seen there. */
#include "monitor.h"

#include <math.h>
#include <string.h>

#define MAX_MONITORS 64
#define LOAD_TAU_NS 1000000000.0

struct ap_monitor {
    int64_t id;
    uintptr_t loop;         /* address of the loop while it lives */
    PyObject *loop_wr;      /* weak reference to the loop */
    PyObject *observers;    /* list */
    double load;            /* smoothed load, as of `updated` */
    ap_ns_t updated;
    ap_ns_t created, wall, select_wait, select_capped;
    uint64_t ticks, select_calls, handles;
    ap_ns_t tick_t0, tick_capped;
    uint32_t tick_handles;
    int in_tick, in_select, running;
    ap_ns_t select_t0, select_timeout, select_cap;
    int stepped;            /* not a BaseEventLoop (uvloop): busy = time in task steps */
    int in_step;
    ap_ns_t step_t0, step_busy;
    uint64_t steps;
};

static ap_monitor_t *monitors[MAX_MONITORS];
static int n_monitors;
static int64_t next_id;
int ap_monitor_count;   /* read by the hooks: 0 means there is nothing to look up */
uint64_t ap_monitor_epoch;

static PyObject *str_loop_start, *str_tick_start, *str_io_start, *str_io_end, *str_tick_end,
    *str_loop_stop;

ap_monitor_t *ap_monitor_find(PyObject *loop)
{
    for (int i = 0; i < n_monitors; i++)
        if (monitors[i]->loop == (uintptr_t)loop)
            return monitors[i];
    return NULL;
}

static ap_monitor_t *by_id(int64_t id)
{
    for (int i = 0; i < n_monitors; i++)
        if (monitors[i]->id == id)
            return monitors[i];
    PyErr_Format(PyExc_ValueError, "no open loop monitor with id %lld", (long long)id);
    return NULL;
}

/* Call method `name` of every observer that has it; errors go to unraisablehook. */
static void notify(ap_monitor_t *m, PyObject *name, PyObject *const *args, size_t nargs)
{
    if (!m->observers || PyList_GET_SIZE(m->observers) == 0)
        return;
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    PyObject *obs = PyList_GetSlice(m->observers, 0, PY_SSIZE_T_MAX);   /* observers may add/remove */
    for (Py_ssize_t i = 0; obs && i < PyList_GET_SIZE(obs); i++) {
        PyObject *o = PyList_GET_ITEM(obs, i);
        PyObject *meth = PyObject_GetAttr(o, name);
        if (!meth) {
            if (PyErr_ExceptionMatches(PyExc_AttributeError))
                PyErr_Clear();   /* an observer may listen to some events only */
            else
                PyErr_WriteUnraisable(o);
            continue;
        }
        PyObject *r = PyObject_Vectorcall(meth, args, nargs, NULL);
        if (!r)
            PyErr_WriteUnraisable(meth);
        Py_XDECREF(r);
        Py_DECREF(meth);
    }
    if (!obs)
        PyErr_Clear();
    Py_XDECREF(obs);
    ap_exc_restore(&exc);
}

static PyObject *timeout_obj(ap_ns_t timeout)
{
    return timeout < 0 ? Py_NewRef(Py_None) : PyFloat_FromDouble((double)timeout / 1e9);
}

/* `load` after dt more ns at `busy_share` in [0, 1]. */
static double ewma(double load, ap_ns_t dt, double busy_share)
{
    if (dt <= 0)
        return load;
    double decay = exp(-(double)dt / LOAD_TAU_NS);
    return load * decay + busy_share * (1.0 - decay);
}

/* Fold [updated, now] into the smoothed load, with `busy_share` in [0, 1]. */
static void load_advance(ap_monitor_t *m, ap_ns_t now, double busy_share)
{
    if (now <= m->updated)
        return;
    m->load = ewma(m->load, now - m->updated, busy_share);
    m->updated = now;
}

void ap_monitor_step_begin(ap_monitor_t *m, ap_ns_t now)
{
    if (!m->stepped)
        return;   /* a standard loop: its ticks and select give the load */
    load_advance(m, now, 0.0);   /* since the last step: not in a task step */
    m->in_step = 1;
    m->step_t0 = now;
}

void ap_monitor_step_end(ap_monitor_t *m, ap_ns_t now)
{
    if (!m->in_step)
        return;   /* opened during this step */
    m->in_step = 0;
    load_advance(m, now, 1.0);
    m->step_busy += now - m->step_t0;
    m->steps++;
}

void ap_monitor_loop_start(ap_monitor_t *m)
{
    m->running = 1;
    m->updated = ap_clock_wall();
    notify(m, str_loop_start, NULL, 0);
}

void ap_monitor_loop_stop(ap_monitor_t *m)
{
    m->running = 0;
    notify(m, str_loop_stop, NULL, 0);
}

void ap_monitor_tick_start(ap_monitor_t *m, ap_ns_t now)
{
    m->in_tick = 1;
    m->tick_t0 = now;
    m->tick_capped = 0;
    m->tick_handles = 0;
    notify(m, str_tick_start, NULL, 0);
}

void ap_monitor_handle(ap_monitor_t *m)
{
    m->tick_handles++;
}

void ap_monitor_tick_end(ap_monitor_t *m, ap_ns_t now)
{
    if (!m->in_tick)
        return;   /* opened during this tick */
    m->in_tick = 0;
    m->ticks++;
    m->handles += m->tick_handles;
    m->wall += now - m->tick_t0;
    /* The part of the tick after the select (or all of it without one) was busy. */
    load_advance(m, now, 1.0);
    PyObject *h = PyLong_FromUnsignedLong(m->tick_handles);
    if (h) {
        notify(m, str_tick_end, &h, 1);
        Py_DECREF(h);
    } else {
        PyErr_Clear();
    }
}

void ap_monitor_io_start(ap_monitor_t *m, ap_ns_t now, ap_ns_t timeout, ap_ns_t cap)
{
    load_advance(m, now, 1.0);   /* from the tick start (or the last event) to here: busy */
    m->in_select = 1;
    m->select_t0 = now;
    m->select_timeout = timeout;
    m->select_cap = cap;
    PyObject *t = timeout_obj(timeout);
    if (t) {
        notify(m, str_io_start, &t, 1);
        Py_DECREF(t);
    } else {
        PyErr_Clear();
    }
}

void ap_monitor_io_end(ap_monitor_t *m, ap_ns_t now, Py_ssize_t events)
{
    ap_ns_t wait = now - m->select_t0, timeout = m->select_timeout, cap = m->select_cap;
    ap_ns_t capped = (cap >= 0 && wait > cap) ? cap : wait;
    m->in_select = 0;
    m->select_calls++;
    m->select_wait += wait;
    m->select_capped += capped;
    m->tick_capped += capped;
    /* The proposal's load: sleeping up to the timeout is idle, past it is busy. */
    load_advance(m, now, wait > 0 ? 1.0 - (double)capped / (double)wait : 0.0);
    PyObject *args[2] = {timeout_obj(timeout), PyLong_FromSsize_t(events < 0 ? 0 : events)};
    if (args[0] && args[1])
        notify(m, str_io_end, args, 2);
    else
        PyErr_Clear();
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
}

/* ------------------------------------------------------------------ Python API */

ap_monitor_t *ap_monitor_new(PyObject *loop)
{
    if (!str_loop_start) {
        str_loop_start = PyUnicode_InternFromString("loop_start");
        str_tick_start = PyUnicode_InternFromString("tick_start");
        str_io_start = PyUnicode_InternFromString("io_start");
        str_io_end = PyUnicode_InternFromString("io_end");
        str_tick_end = PyUnicode_InternFromString("tick_end");
        str_loop_stop = PyUnicode_InternFromString("loop_stop");
        if (!str_loop_start || !str_tick_start || !str_io_start || !str_io_end || !str_tick_end ||
            !str_loop_stop)
            return NULL;
    }
    if (ap_monitor_find(loop)) {
        PyErr_SetString(PyExc_RuntimeError, "this loop already has an open LoopMonitor");
        return NULL;
    }
    if (n_monitors == MAX_MONITORS) {
        PyErr_SetString(PyExc_RuntimeError, "too many open loop monitors (64)");
        return NULL;
    }
    ap_monitor_t *m = PyMem_RawCalloc(1, sizeof *m);
    if (!m) {
        PyErr_NoMemory();
        return NULL;
    }
    m->loop_wr = PyWeakref_NewRef(loop, NULL);
    m->observers = PyList_New(0);
    if (!m->loop_wr || !m->observers) {
        ap_monitor_discard(m);
        return NULL;
    }
    return m;
}

void ap_monitor_discard(ap_monitor_t *m)
{
    Py_XDECREF(m->loop_wr);
    Py_XDECREF(m->observers);
    PyMem_RawFree(m);
}

PyObject *ap_monitor_open(ap_monitor_t *m, PyObject *loop)
{
    m->id = ++next_id;
    m->loop = (uintptr_t)loop;
    m->created = m->updated = ap_clock_wall();
    PyObject *running = PyObject_CallMethod(loop, "is_running", NULL);
    m->running = running && PyObject_IsTrue(running) == 1;
    Py_XDECREF(running);
    PyErr_Clear();
    PyObject *be = PyImport_ImportModule("asyncio.base_events");
    PyObject *bel = be ? PyObject_GetAttrString(be, "BaseEventLoop") : NULL;
    m->stepped = bel && PyObject_IsInstance(loop, bel) == 0;
    Py_XDECREF(be);
    Py_XDECREF(bel);
    PyErr_Clear();
    monitors[n_monitors++] = m;
    ap_monitor_count = n_monitors;
    return PyLong_FromLongLong(m->id);
}

int ap_monitor_close(int64_t id)
{
    for (int i = 0; i < n_monitors; i++) {
        if (monitors[i]->id != id)
            continue;
        ap_monitor_t *m = monitors[i];
        monitors[i] = monitors[--n_monitors];
        ap_monitor_count = n_monitors;
        ap_monitor_epoch++;
        ap_monitor_discard(m);
        return 1;
    }
    return 0;   /* closing twice is harmless */
}

PyObject *ap_monitor_observers(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int64_t id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    ap_monitor_t *m = by_id(id);
    return m ? Py_NewRef(m->observers) : NULL;
}

PyObject *ap_monitor_read(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int64_t id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    ap_monitor_t *m = by_id(id);
    if (!m)
        return NULL;
    /* The smoothed load as of now: time since the last event counts as busy while the
     * loop runs handles, as sleeping while it waits in select (up to its timeout). */
    ap_ns_t now = ap_clock_wall(), dt = now - m->updated;
    double load = m->load;
    ap_ns_t step_busy = m->step_busy;
    /* Read inside a tick (from a handle): the tick so far is part of the wall, as the
     * select it may have waited in is already part of the select wait. */
    ap_ns_t wall = m->wall + (m->in_tick && now > m->tick_t0 ? now - m->tick_t0 : 0);
    /* Read from another thread (a metrics scrape) while the loop waits in select: that
     * wait so far is select wait, as it is part of the wall, so busy (wall - select wait)
     * never counts it and never goes back down when the select ends. */
    ap_ns_t select_wait = m->select_wait, select_capped = m->select_capped;
    if (m->in_tick && m->in_select && now > m->select_t0) {
        ap_ns_t wait = now - m->select_t0, cap = m->select_cap;
        select_wait += wait;
        select_capped += (cap >= 0 && wait > cap) ? cap : wait;
    }
    if (m->stepped) {
        /* Called from a task step of this loop (a request handler): busy since it began. */
        if (m->in_step) {
            load = ewma(load, dt, 1.0);   /* updated == step_t0 */
            step_busy += now - m->step_t0;
        } else {
            load = ewma(load, dt, 0.0);
        }
    } else {
        double share = 0.0;
        if (m->in_select) {
            ap_ns_t wait = now - m->select_t0, cap = m->select_cap;
            share = (cap >= 0 && wait > cap) ? (double)(wait - cap) / (double)wait : 0.0;
        } else if (m->running) {
            share = 1.0;
        }
        if (m->running)
            load = ewma(load, dt, share);
    }
    return Py_BuildValue("{s:d,s:O,s:L,s:K,s:L,s:L,s:L,s:L,s:K,s:K,s:K,s:O}", "load", load,
                         "stepped", m->stepped ? Py_True : Py_False, "step_busy_ns", (long long)step_busy,
                         "steps", (unsigned long long)m->steps, "wall_ns", (long long)wall,
                         "select_wait_ns", (long long)select_wait, "select_capped_ns",
                         (long long)select_capped, "age_ns", (long long)(now - m->created), "ticks",
                         (unsigned long long)m->ticks, "select_calls", (unsigned long long)m->select_calls,
                         "handles", (unsigned long long)m->handles, "running",
                         m->running ? Py_True : Py_False);
}
