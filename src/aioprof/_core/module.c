/* module.c - the aioprof._core module: sessions, faults, thread records and the
 * Python-facing functions (multi-phase init, PEP 489).
 *
 * The session is process-wide (ap_session) because the hooks it feeds are installed
 * on process-wide classes; see hooks.c. */
#include "monitor.h"

#include <string.h>

ap_session_t *ap_session;
static uint64_t last_gen;

/* Each thread caches its record; the generation tells a record of an older session
 * (freed at its stop) from the current one. */
static AP_TLS ap_thread_t *tl_thread;
static AP_TLS uint64_t tl_gen;

void ap_fault(ap_session_t *s, const char *what)
{
    /* Keep the first error's text, switch accounting off, let the program go on. */
    PyObject *msg = NULL;
    if (PyErr_Occurred()) {
        ap_exc_state_t exc;
        ap_exc_save(&exc);
        PyObject *val = ap_exc_value(&exc);
        msg = val ? PyUnicode_FromFormat("internal fault while %s (%s: %S); profiling disabled", what,
                                         _PyType_Name(Py_TYPE(val)), val)
                  : NULL;
        ap_exc_restore(&exc);
        PyErr_Clear();
    }
    if (!msg)
        msg = PyUnicode_FromFormat("internal fault while %s; profiling disabled", what);
    if (!msg)
        PyErr_Clear();
    if (!s->disabled && msg && PyList_Append(s->faults, msg) < 0)
        PyErr_Clear();
    Py_XDECREF(msg);
    s->disabled = 1;
}

ap_thread_t *ap_thread_peek(ap_session_t *s)
{
    return tl_thread && tl_gen == s->gen ? tl_thread : NULL;
}

ap_thread_t *ap_thread_get(ap_session_t *s)
{
    if (tl_thread && tl_gen == s->gen)
        return tl_thread;
    ap_thread_t *th = PyMem_RawCalloc(1, sizeof *th);
    if (!th) {
        PyErr_NoMemory();
        ap_fault(s, "allocating a thread record");
        return NULL;
    }
    th->ident = PyThread_get_thread_ident();
    th->sampled = ap_sampler_mode(th->ident);
    th->tstate = PyThreadState_Get();
    th->cb = AP_NONE;
    th->cur_ready = -1;
    th->win_wall = ap_clock_wall();
    th->win_cpu = ap_clock_cpu();
    th->next = s->threads;
    s->threads = th;
    tl_thread = th;
    tl_gen = s->gen;
    return th;
}

static void session_free(ap_session_t *s)
{
    /* Live records that were not kept are owned by the live table only. */
    for (size_t i = 0; i < s->live.cap; i++) {
        ap_task_t *t = (ap_task_t *)s->live.vals[i];
        if (s->live.keys[i] && t && !t->kept)
            ap_task_free(t);
    }
    for (uint32_t i = 0; i < s->n_tasks; i++)
        ap_task_free(s->tasks[i]);
    PyMem_RawFree(s->tasks);
    for (uint32_t i = 0; i < s->n_codes; i++) {
        Py_XDECREF(s->codes[i].code);
        Py_XDECREF(s->codes[i].qualname);
        Py_XDECREF(s->codes[i].filename);
    }
    PyMem_RawFree(s->codes);
    PyMem_RawFree(s->sites);
    for (uint32_t i = 0; i < s->n_chains; i++)
        PyMem_RawFree(s->chains[i].sites);
    PyMem_RawFree(s->chains);
    for (uint32_t i = 0; i < s->n_coros; i++)
        ap_hist_free(&s->coros[i].hist);
    PyMem_RawFree(s->coros);
    for (uint32_t i = 0; i < s->n_cbs; i++)
        Py_XDECREF(s->cbs[i].name);
    PyMem_RawFree(s->cbs);
    for (uint32_t i = 0; i < s->n_loops; i++)
        ap_loop_free(s->loops[i]);
    PyMem_RawFree(s->loops);
    for (uint32_t i = 0; i < s->n_loop_groups; i++)
        ap_loop_free(s->loop_groups[i]);
    PyMem_RawFree(s->loop_groups);
    while (s->threads) {
        ap_thread_t *next = s->threads->next;
        Py_XDECREF(s->threads->tick_ready);
        Py_XDECREF(s->threads->tick_handle_cls);
        PyMem_RawFree(s->threads);
        s->threads = next;
    }
    ap_table_free(&s->code_idx);
    ap_table_free(&s->site_idx);
    ap_table_free(&s->chain_idx);
    ap_table_free(&s->cb_idx);
    ap_table_free(&s->live);
    ap_table_free(&s->wr_tab);
    ap_table_free(&s->loop_idx);
    ap_table_free(&s->line_cache);
    ap_stacks_free(s);
    PyMem_RawFree(s->trace);
    Py_XDECREF(s->faults);
    Py_XDECREF(s->asyncio_dir);
    Py_XDECREF(s->aioprof_dir);
    Py_XDECREF(s->stdlib_dir);
    Py_XDECREF(s->asyncio_all);
    Py_XDECREF(s->task_types);
    Py_XDECREF(s->timer_type);
    Py_XDECREF(s->wr_task_cb);
    Py_XDECREF(s->wr_loop_cb);
    PyMem_RawFree(s);
}

/* os.path.dirname(module.__file__) + os.sep, as a new reference. */
static PyObject *package_dir(const char *module)
{
    PyObject *m = PyImport_ImportModule(module), *os = NULL, *path = NULL, *file = NULL, *dir = NULL,
             *sep = NULL, *res = NULL;
    if (!m || !(os = PyImport_ImportModule("os")) || !(path = PyObject_GetAttrString(os, "path")) ||
        !(file = PyObject_GetAttrString(m, "__file__")))
        goto done;
    PyObject *real = PyObject_CallMethod(path, "realpath", "O", file);
    if (!real)
        goto done;
    dir = PyObject_CallMethod(path, "dirname", "O", real);
    Py_DECREF(real);
    if (dir && (sep = PyObject_GetAttrString(os, "sep")))
        res = PyUnicode_Concat(dir, sep);
done:
    Py_XDECREF(m);
    Py_XDECREF(os);
    Py_XDECREF(path);
    Py_XDECREF(file);
    Py_XDECREF(dir);
    Py_XDECREF(sep);
    return res;
}

/* package_dir(module), computed once per process and then shared by every session: a
 * package does not move while the process runs. realpath() makes one lstat per path
 * component, each releasing and re-taking the GIL; while other threads run busy event
 * loops (each tick releases the GIL for an instant in select and takes it straight back),
 * a thread that released the GIL can wait a long time to get it back (the GIL convoy
 * effect), so start() must not release it a dozen times. New reference or NULL. */
static PyObject *package_dir_once(const char *module, PyObject **cache)
{
    if (!*cache)
        *cache = package_dir(module);
    return Py_XNewRef(*cache);
}

static PyObject *task_types(void)
{
    PyObject *tasks = PyImport_ImportModule("asyncio.tasks");
    if (!tasks)
        return NULL;
    PyObject *c = PyObject_GetAttrString(tasks, "Task");
    PyObject *py = PyObject_GetAttrString(tasks, "_PyTask");
    Py_DECREF(tasks);
    if (!py)
        PyErr_Clear();
    PyObject *res = NULL;
    if (c)
        res = (py && py != c) ? PyTuple_Pack(2, c, py) : PyTuple_Pack(1, c);
    Py_XDECREF(c);
    Py_XDECREF(py);
    return res;
}

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
    ap_session_t *s = PyMem_RawCalloc(1, sizeof *s);
    if (!s)
        return PyErr_NoMemory();
    s->gen = ++last_gen;
    s->max_tasks = (uint64_t)max_tasks;
    s->cpu_window = window;
    s->slow_ns = slow;
    s->sample_interval = interval;
    s->async_stacks = async_stacks;
    s->faults = PyList_New(0);
    static PyObject *asyncio_dir, *aioprof_dir, *stdlib_dir;   /* see package_dir_once */
    s->asyncio_dir = package_dir_once("asyncio", &asyncio_dir);
    s->aioprof_dir = s->asyncio_dir ? package_dir_once("aioprof", &aioprof_dir) : NULL;
    s->stdlib_dir = s->aioprof_dir ? package_dir_once("os", &stdlib_dir) : NULL;
    PyObject *asyncio = s->stdlib_dir ? PyImport_ImportModule("asyncio") : NULL;
    s->asyncio_all = asyncio ? PyObject_GetAttrString(asyncio, "__all__") : NULL;
    Py_XDECREF(asyncio);
    s->task_types = s->asyncio_all ? task_types() : NULL;
    PyObject *events = s->task_types ? PyImport_ImportModule("asyncio.events") : NULL;
    s->timer_type = events ? PyObject_GetAttrString(events, "TimerHandle") : NULL;
    Py_XDECREF(events);
    s->wr_task_cb = s->timer_type ? PyObject_GetAttrString(module, "_task_died") : NULL;
    s->wr_loop_cb = s->wr_task_cb ? PyObject_GetAttrString(module, "_loop_died") : NULL;
    if (!s->faults || !s->wr_loop_cb || ap_trace_init(s, (uint32_t)trace_cap) < 0) {
        session_free(s);
        return NULL;
    }
    s->t0 = ap_clock_wall();
    ap_session = s;
    if (ap_hooks_acquire() < 0) {
        ap_session = NULL;
        session_free(s);
        return NULL;
    }
    PyObject *sig_handler = PyObject_GetAttrString(module, "_sample_signal");
    int sampler = sig_handler ? ap_sampler_start(s, sig_handler) : -1;
    Py_XDECREF(sig_handler);
    if (sampler < 0) {
        ap_hooks_release();
        ap_session = NULL;
        session_free(s);
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
    if (!s->disabled && tl_thread && tl_gen == s->gen)
        ap_cpu_flush(s, tl_thread, now);
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
    session_free(s);
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
    {"monitor_add", ap_monitor_add, METH_O, "monitor_add(loop) -> int: open a loop monitor."},
    {"monitor_close", ap_monitor_close, METH_O, "monitor_close(id): close a loop monitor."},
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
