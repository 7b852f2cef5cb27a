/* session.c - the data of one profiling session: its lifetime (creating and freeing the
 * records), thread records, faults. The bottom of the core above the clock, histograms
 * and tables: it calls nothing above it (docs/design.md, "Layers"). */
#include "profile.h"

#include <string.h>

int ap_grow(void **arr, uint32_t *cap, size_t elem, uint32_t n)
{
    if (n < *cap)
        return 0;
    uint32_t ncap = *cap ? *cap * 2 : 64;
    void *p = PyMem_RawRealloc(*arr, (size_t)ncap * elem);
    if (!p)
        return -1;
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(ncap - *cap) * elem);
    *arr = p;
    *cap = ncap;
    return 0;
}

ap_session_t *ap_session;
ap_sampling_t ap_sampling;
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
    if (ap_sampling.started)
        th->sampled = ap_sampling.main_mode && th->ident == ap_sampling.main_ident ? ap_sampling.main_mode
                                                                                   : AP_SAMPLE_GIL;
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

ap_session_t *ap_session_new(PyObject *module)
{
    ap_session_t *s = PyMem_RawCalloc(1, sizeof *s);
    if (!s)
        return (ap_session_t *)PyErr_NoMemory();
    s->gen = ++last_gen;
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
    if (!s->faults || !s->wr_loop_cb) {
        ap_session_free(s);
        return NULL;
    }
    return s;
}

void ap_session_free(ap_session_t *s)
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

void ap_task_free(ap_task_t *t)
{
    Py_XDECREF(t->wr);
    Py_XDECREF(t->name);
    Py_XDECREF(t->exc_name);
    Py_XDECREF(t->coro_name);
    Py_XDECREF(t->created_by);
    Py_XDECREF(t->created_by_file);
    PyMem_RawFree(t->awaits);
    PyMem_RawFree(t);
}

void ap_loop_free(ap_loop_t *l)
{
    Py_XDECREF(l->wr);
    Py_XDECREF(l->type_name);
    Py_XDECREF(l->module);
    Py_XDECREF(l->thread_name);
    PyMem_RawFree(l->ring);
    ap_hist_free(&l->tick_hist);
    ap_hist_free(&l->handles_hist);
    ap_hist_free(&l->lag_hist);
    ap_hist_free(&l->timer_hist);
    PyMem_RawFree(l);
}


void ap_stacks_free(ap_session_t *s)
{
    for (uint32_t i = 0; i < s->n_stacks; i++)
        PyMem_RawFree(s->stacks[i].frames);
    PyMem_RawFree(s->stacks);
    PyMem_RawFree(s->frames);
    ap_table_free(&s->stack_idx);
    ap_table_free(&s->frame_idx);
}
