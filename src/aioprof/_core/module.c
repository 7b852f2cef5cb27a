/* module.c - the aioprof._core module: the Python-facing functions (multi-phase init,
 * PEP 489), and start/stop, which create the session (session.c) and start and stop
 * the hooks, the sampler and the eager-task watch on it. The top of the core: nothing
 * calls into it (docs/design.md, "Layers").
 *
 * The session is process-wide (ap_session) because the hooks it feeds are installed
 * on process-wide classes; see hooks.c. */
#include "monitor.h"

#include <string.h>

/* ------------------------------------------------------------------ Python API */

static PyObject *mod_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    long long max_tasks, window, slow, interval = 0, trace_cap = 0;
    int async_stacks = 0;
    if (nargs != 3 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "start(max_tasks, cpu_window_ns, slow_ns[, interval_ns, async_stacks, trace_events])");
        return NULL;
    }
    max_tasks = PyLong_AsLongLong(args[0]);
    window = PyLong_AsLongLong(args[1]);
    slow = PyLong_AsLongLong(args[2]);
    if (nargs == 6) {
        interval = PyLong_AsLongLong(args[3]);
        async_stacks = PyObject_IsTrue(args[4]);
        trace_cap = PyLong_AsLongLong(args[5]);
    }
    if (PyErr_Occurred())
        return NULL;
    if (max_tasks < 0 || window <= 0 || slow < 0 || interval < 0 || async_stacks < 0 || trace_cap < 0 ||
        trace_cap > 100000000) {
        PyErr_SetString(PyExc_ValueError, "start(): max_tasks >= 0, cpu_window_ns > 0, slow_ns >= 0, "
                                          "interval_ns >= 0 and 0 <= trace_events <= 1e8 required");
        return NULL;
    }
    if (ap_session) {
        PyErr_SetString(PyExc_RuntimeError, "an aioprof profiler is already running in this process");
        return NULL;
    }
    ap_session_t *s = ap_session_new(module);
    if (!s)
        return NULL;
    s->max_tasks = (uint64_t)max_tasks;
    s->cpu_window = window;
    s->slow_ns = slow;
    s->sample_interval = interval;
    s->async_stacks = async_stacks;
    if (ap_trace_init(s, (uint32_t)trace_cap) < 0) {
        ap_session_free(s);
        return NULL;
    }
    s->t0 = ap_clock_wall();
    ap_session = s;
    if (ap_hooks_acquire() < 0) {
        ap_session = NULL;
        ap_session_free(s);
        return NULL;
    }
    PyObject *sig_handler = PyObject_GetAttrString(module, "_sample_signal");
    int sampler = sig_handler ? ap_sampler_start(s, sig_handler) : -1;
    Py_XDECREF(sig_handler);
    if (sampler < 0) {
        ap_hooks_release();
        ap_session = NULL;
        ap_session_free(s);
        return NULL;
    }
    ap_eager_watch_start(s);
    Py_RETURN_NONE;
}

static PyObject *mod_snapshot(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(unused))
{
    ap_session_t *s = ap_session;
    if (!s) {
        PyErr_SetString(PyExc_RuntimeError, "no aioprof profiler is running");
        return NULL;
    }
    ap_ns_t now = ap_clock_wall();
    ap_thread_t *th = s->disabled ? NULL : ap_thread_peek(s);
    if (th)
        ap_cpu_flush(s, th, now);
    return ap_snapshot(s, now);
}

static PyObject *mod_metrics(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(unused))
{
    ap_session_t *s = ap_session;
    if (!s) {
        PyErr_SetString(PyExc_RuntimeError, "no aioprof profiler is running");
        return NULL;
    }
    return ap_metrics(s, ap_clock_wall());
}

static PyObject *mod_stop(PyObject *module, PyObject *Py_UNUSED(unused))
{
    ap_session_t *s = ap_session;
    if (!s) {
        PyErr_SetString(PyExc_RuntimeError, "no aioprof profiler is running");
        return NULL;
    }
    ap_sampler_stop();
    ap_eager_watch_stop();
    ap_hooks_release();
    PyObject *snap = mod_snapshot(module, NULL);
    s->t_stop = ap_clock_wall();
    ap_session = NULL;
    ap_session_free(s);
    return snap;
}

static PyObject *mod_is_active(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(unused))
{
    return PyBool_FromLong(ap_session != NULL);
}

static PyObject *mod_set_fake_clock(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    if (ap_session) {
        PyErr_SetString(PyExc_RuntimeError, "set_fake_clock() while profiling would mix two clocks");
        return NULL;
    }
    ap_clock_set_fake(on);
    Py_RETURN_NONE;
}

static PyObject *mod_fake_advance(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "fake_advance(wall_ns, cpu_ns=0)");
        return NULL;
    }
    long long wall = PyLong_AsLongLong(args[0]);
    long long cpu = nargs > 1 ? PyLong_AsLongLong(args[1]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (!ap_clock_is_fake() || wall < 0 || cpu < 0) {
        PyErr_SetString(PyExc_ValueError, "fake_advance() needs the fake clock on and non-negative steps");
        return NULL;
    }
    ap_clock_advance(wall, cpu);
    Py_RETURN_NONE;
}

static PyObject *mod_clock_ns(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(unused))
{
    return PyLong_FromLongLong(ap_clock_wall());
}

static PyObject *mod_hist_quantiles(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "hist_quantiles(values, quantiles)");
        return NULL;
    }
    ap_hist_t h = {0};
    PyObject *vals = PySequence_Fast(args[0], "values must be a sequence"), *res = NULL;
    PyObject *qs = vals ? PySequence_Fast(args[1], "quantiles must be a sequence") : NULL;
    if (!qs)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(vals); i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(vals, i));
        if ((v == -1 && PyErr_Occurred()) || ap_hist_add(&h, v) < 0) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            goto done;
        }
    }
    res = PyList_New(PySequence_Fast_GET_SIZE(qs));
    for (Py_ssize_t i = 0; res && i < PySequence_Fast_GET_SIZE(qs); i++) {
        double q = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(qs, i));
        if (q == -1.0 && PyErr_Occurred()) {
            Py_CLEAR(res);
            break;
        }
        PyList_SET_ITEM(res, i, PyLong_FromLongLong(ap_hist_quantile(&h, q)));
    }
done:
    ap_hist_free(&h);
    Py_XDECREF(vals);
    Py_XDECREF(qs);
    return res;
}

static PyObject *mod_uv_hook(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(unused))
{
    if (ap_hooks_uvloop() < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Loop monitors (monitor.c) keep the hooks installed while they are open. */
static PyObject *mod_monitor_add(PyObject *Py_UNUSED(module), PyObject *loop)
{
    ap_monitor_t *m = ap_monitor_new(loop);
    if (!m)
        return NULL;
    if (ap_hooks_acquire() < 0) {
        ap_monitor_discard(m);
        return NULL;
    }
    return ap_monitor_open(m, loop);
}

static PyObject *mod_monitor_close(PyObject *Py_UNUSED(module), PyObject *arg)
{
    int64_t id = PyLong_AsLongLong(arg);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    if (ap_monitor_close(id))
        ap_hooks_release();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))mod_start, METH_FASTCALL,
     "start(max_tasks, cpu_window_ns, slow_ns): install the hooks and begin a session."},
    {"stop", mod_stop, METH_NOARGS, "stop() -> dict: remove the hooks, end the session, return its snapshot."},
    {"snapshot", mod_snapshot, METH_NOARGS, "snapshot() -> dict: the running session's figures (ns)."},
    {"metrics", mod_metrics, METH_NOARGS, "metrics() -> dict: the figures of aioprof.metrics (ns), cheaply."},
    {"is_active", mod_is_active, METH_NOARGS, "is_active() -> bool: a session is running."},
    {"set_fake_clock", mod_set_fake_clock, METH_O, "set_fake_clock(on): use a clock moved by fake_advance()."},
    {"fake_advance", (PyCFunction)(void (*)(void))mod_fake_advance, METH_FASTCALL,
     "fake_advance(wall_ns, cpu_ns=0): move the fake clock forward."},
    {"clock_ns", mod_clock_ns, METH_NOARGS, "clock_ns() -> int: aioprof's wall clock now (ns)."},
    {"hist_quantiles", (PyCFunction)(void (*)(void))mod_hist_quantiles, METH_FASTCALL,
     "hist_quantiles(values_ns, quantiles) -> list: quantiles of values through aioprof's histogram."},
    {"monitor_add", mod_monitor_add, METH_O, "monitor_add(loop) -> int: open a loop monitor."},
    {"monitor_close", mod_monitor_close, METH_O, "monitor_close(id): close a loop monitor."},
    {"monitor_observers", ap_monitor_observers, METH_O, "monitor_observers(id) -> list: its observers."},
    {"monitor_read", ap_monitor_read, METH_O, "monitor_read(id) -> dict: its figures now."},
    {"_sample_signal", (PyCFunction)(void (*)(void))ap_sample_signal, METH_FASTCALL,
     "_sample_signal(signum, frame): the sampling signal's handler (internal; 3.10-3.12)."},
    {"_uv_hook", mod_uv_hook, METH_NOARGS, "_uv_hook(): hook uvloop, just imported by the program (internal)."},
    {"_task_died", ap_task_died, METH_O, "weak-reference callback (internal)."},
    {"_loop_died", ap_loop_died, METH_O, "weak-reference callback (internal)."},
    {NULL, NULL, 0, NULL},
};

static int mod_exec(PyObject *module)
{
    return PyModule_AddIntConstant(module, "HIST_BUCKETS", AP_HIST_BUCKETS);
}

/* Py_mod_gil (3.13+): aioprof relies on the GIL (one session, its tables and hooks are
 * process-wide and unlocked), so a free-threaded interpreter turns the GIL back on when
 * it imports _core (with a RuntimeWarning; PYTHON_GIL=0 overrides that, unsupported).
 * Free-threaded builds are not tested (docs/interpreters.md). */
static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, mod_exec},
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aioprof._core",
    .m_doc = "aioprof's measuring core: event-loop and task hooks, clocks, tables, aggregation.",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModuleDef_Init(&moddef);
}
