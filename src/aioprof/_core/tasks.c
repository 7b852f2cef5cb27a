/* tasks.c - per-task and per-coroutine accounting, await chains, creation sites,
 * callbacks, and the CPU windows.
 *
 * A task's life is a small state machine driven by the hooks (docs/design.md):
 * READY -> RUNNING -> SUSPENDED -> READY ... -> DONE. Every transition adds the time
 * since the last one to exactly one of busy, scheduled or idle, so the three always
 * sum to the task's lifetime. */
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

static int starts_with(PyObject *str, PyObject *prefix)
{
    return prefix && str && PyUnicode_Check(str) &&
           PyUnicode_Tailmatch(str, prefix, 0, PY_SSIZE_T_MAX, -1) == 1;
}

/* ------------------------------------------------------------------ codes, sites */

/* Is `file` installed code: in a site-packages or dist-packages directory, or frozen
 * (<frozen ...>, the standard library's)? */
static int is_packages_file(PyObject *file)
{
    if (!PyUnicode_Check(file))
        return 0;
    static const char *const marks[] = {"/site-packages/", "/dist-packages/", "\\site-packages\\",
                                        "\\dist-packages\\", "<frozen "};
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
        PyObject *m = PyUnicode_FromString(marks[i]);
        Py_ssize_t at = m ? PyUnicode_Find(file, m, 0, PY_SSIZE_T_MAX, 1) : -2;
        Py_XDECREF(m);
        if (at == -2) {
            PyErr_Clear();
            return 0;
        }
        if (at >= 0)
            return 1;
    }
    return 0;
}

uint32_t ap_code_get(ap_session_t *s, PyObject *code)
{
    uintptr_t v = ap_table_get(&s->code_idx, (uintptr_t)code);
    if (v)
        return (uint32_t)(v - 1);
    if (ap_grow((void **)&s->codes, &s->cap_codes, sizeof(ap_code_t), s->n_codes) < 0) {
        PyErr_NoMemory();
        return AP_NONE;
    }
    PyObject *qual = ap_code_qualname((PyCodeObject *)code);
    PyObject *file = PyObject_GetAttrString(code, "co_filename");
    PyObject *first = PyObject_GetAttrString(code, "co_firstlineno");
    if (!qual || !file || !first) {
        Py_XDECREF(qual);
        Py_XDECREF(file);
        Py_XDECREF(first);
        return AP_NONE;
    }
    uint32_t idx = s->n_codes;
    ap_code_t *c = &s->codes[idx];
    c->code = Py_NewRef(code);
    c->qualname = qual;
    c->filename = file;
    c->firstlineno = (int)PyLong_AsLong(first);
    Py_DECREF(first);
    c->is_asyncio = starts_with(file, s->asyncio_dir);
    c->is_aioprof = starts_with(file, s->aioprof_dir);
    c->is_library = c->is_aioprof || starts_with(file, s->stdlib_dir) || is_packages_file(file);
    /* asyncio's own coroutines (BaseEventLoop.shutdown_asyncgens, ...) are internal;
     * the public ones in asyncio.__all__, such as sleep(), are what the user asked for. */
    c->is_internal = 0;
    if (c->is_asyncio) {
        PyObject *name = PyObject_GetAttrString(code, "co_name");
        int pub = name && s->asyncio_all ? PySequence_Contains(s->asyncio_all, name) : 0;
        Py_XDECREF(name);
        if (pub < 0)
            PyErr_Clear();
        c->is_internal = pub != 1 || PyUnicode_FindChar(qual, '.', 0, PY_SSIZE_T_MAX, 1) >= 0;
    }
    /* uvloop's compiled loop ("uvloop/loop.pyx") runs its own shutdown coroutines. */
    if (PyUnicode_Check(file) && PyUnicode_GetLength(file) > 7) {
        PyObject *pre = PyUnicode_FromString("uvloop/");
        if (pre && PyUnicode_Tailmatch(file, pre, 0, 7, -1) == 1)
            c->is_internal = 1;
        Py_XDECREF(pre);
        PyErr_Clear();
    }
    c->coro = AP_NONE;
    c->is_loop_entry = c->is_create_task = c->is_handle_runner = 0;
    if (c->is_asyncio) {
        /* Where the loop calls into handles: a sampled stack stops there. */
        static const char *const entries[] = {"_run", "_run_once", "run_forever", "run_until_complete", "run"};
        PyObject *name = PyObject_GetAttrString(code, "co_name");
        for (size_t i = 0; name && i < sizeof entries / sizeof *entries; i++)
            if (PyUnicode_CompareWithASCIIString(name, entries[i]) == 0)
                c->is_loop_entry = 1;
        c->is_handle_runner = name && (PyUnicode_CompareWithASCIIString(name, "_run_once") == 0 ||
                                       PyUnicode_CompareWithASCIIString(name, "_run") == 0);
        PyObject *tail = name ? PyUnicode_FromString("base_events.py") : NULL;
        c->is_create_task = tail && PyUnicode_CompareWithASCIIString(name, "create_task") == 0 &&
                            PyUnicode_Tailmatch(file, tail, 0, PY_SSIZE_T_MAX, 1) == 1;
        Py_XDECREF(tail);
        Py_XDECREF(name);
        PyErr_Clear();
    }
    if (ap_table_put(&s->code_idx, (uintptr_t)code, idx + 1) < 0) {
        Py_CLEAR(c->code);
        Py_CLEAR(c->qualname);
        Py_CLEAR(c->filename);
        PyErr_NoMemory();
        return AP_NONE;
    }
    s->n_codes++;
    return idx;
}

uint32_t ap_site_get(ap_session_t *s, PyObject *code, int line)
{
    uintptr_t key = ap_mix2((uintptr_t)code, (uintptr_t)(unsigned)line);
    uintptr_t v = ap_table_get(&s->site_idx, key);
    if (v) {
        ap_site_t *st = &s->sites[v - 1];
        /* A 64-bit mix collision is astronomically rare; treat it as unknown. */
        return (s->codes[st->code].code == code && st->line == line) ? (uint32_t)(v - 1) : AP_NONE;
    }
    uint32_t c = ap_code_get(s, code);
    if (c == AP_NONE)
        return AP_NONE;
    if (ap_grow((void **)&s->sites, &s->cap_sites, sizeof(ap_site_t), s->n_sites) < 0 ||
        ap_table_put(&s->site_idx, key, s->n_sites + 1) < 0) {
        PyErr_NoMemory();
        return AP_NONE;
    }
    ap_site_t *st = &s->sites[s->n_sites];
    memset(st, 0, sizeof *st);
    st->code = c;
    st->line = line;
    return s->n_sites++;
}

static uint32_t chain_get(ap_session_t *s, const uint32_t *sites, uint32_t n)
{
    uintptr_t key = ap_seq_hash(sites, n, 0x5157);
    uintptr_t v = ap_table_get(&s->chain_idx, key);
    if (v) {
        ap_chain_t *c = &s->chains[v - 1];
        return (c->n == n && memcmp(c->sites, sites, n * sizeof *sites) == 0) ? (uint32_t)(v - 1) : AP_NONE;
    }
    uint32_t *copy = PyMem_RawMalloc(n * sizeof *sites + 1);
    if (!copy || ap_grow((void **)&s->chains, &s->cap_chains, sizeof(ap_chain_t), s->n_chains) < 0 ||
        ap_table_put(&s->chain_idx, key, s->n_chains + 1) < 0) {
        PyMem_RawFree(copy);
        PyErr_NoMemory();
        return AP_NONE;
    }
    memcpy(copy, sites, n * sizeof *sites);
    s->chains[s->n_chains].n = n;
    s->chains[s->n_chains].sites = copy;
    return s->n_chains++;
}

/* ------------------------------------------------------------------ identifying tasks */

static PyMethodDef *wakeup_def;      /* C Task's task_wakeup, learnt on first sight */
static PyTypeObject *stepwrap_type;  /* C Task's TaskStepMethWrapper */

static int is_task(ap_session_t *s, PyObject *obj)
{
    if (!s)
        return 1;   /* a loop monitor without a session: the callback's shape is enough */
    Py_ssize_t n = PyTuple_GET_SIZE(s->task_types);
    for (Py_ssize_t i = 0; i < n; i++)   /* exact types first: the common case, no MRO walk */
        if (Py_IS_TYPE(obj, (PyTypeObject *)PyTuple_GET_ITEM(s->task_types, i)))
            return 1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyType_IsSubtype(Py_TYPE(obj), (PyTypeObject *)PyTuple_GET_ITEM(s->task_types, i)))
            return 1;
    return 0;
}

static int name_is(const char *tp_name, const char *want)
{
    size_t a = strlen(tp_name), b = strlen(want);
    return a >= b && strcmp(tp_name + a - b, want) == 0 && (a == b || tp_name[a - b - 1] == '.');
}

PyObject *ap_task_of_callback(ap_session_t *s, PyObject *cb)
{
    static PyGetSetDef *stepwrap_self;   /* TaskStepMethWrapper.__self__'s getter */
    PyTypeObject *tp = Py_TYPE(cb);
    if (tp == stepwrap_type || (!stepwrap_type && name_is(tp->tp_name, "TaskStepMethWrapper"))) {
        if (!stepwrap_self && !(stepwrap_self = ap_getset_of(tp, "__self__")))
            return NULL;
        PyObject *self = stepwrap_self->get(cb, stepwrap_self->closure);
        if (!self) {
            PyErr_Clear();
            return NULL;
        }
        Py_DECREF(self);   /* the wrapper keeps the task alive: borrowed is safe */
        if (!is_task(s, self))
            return NULL;
        stepwrap_type = tp;
        return self;
    }
    if (PyCFunction_Check(cb)) {
        PyMethodDef *ml = ((PyCFunctionObject *)cb)->m_ml;
        if (ml != wakeup_def && (wakeup_def || strcmp(ml->ml_name, "task_wakeup") != 0))
            return NULL;
        PyObject *self = PyCFunction_GET_SELF(cb);
        if (!self || !is_task(s, self))
            return NULL;
        wakeup_def = ml;
        return self;
    }
    if (PyMethod_Check(cb)) {
        /* The pure-Python Task schedules its bound __step / __wakeup. */
        PyObject *fn = PyMethod_GET_FUNCTION(cb);
        if (!PyFunction_Check(fn))
            return NULL;
        PyObject *name = ((PyFunctionObject *)fn)->func_name;
        if (!PyUnicode_Check(name) || (PyUnicode_CompareWithASCIIString(name, "__step") != 0 &&
                                       PyUnicode_CompareWithASCIIString(name, "__wakeup") != 0))
            return NULL;
        PyObject *self = PyMethod_GET_SELF(cb);
        return is_task(s, self) ? self : NULL;
    }
    return NULL;
}

ap_task_t *ap_task_find(ap_session_t *s, PyObject *task)
{
    return (ap_task_t *)ap_table_get(&s->live, (uintptr_t)task);
}

/* Has the coroutine not started yet? (Then the task was created just now.) Mirrors
 * inspect.getcoroutinestate(): created = has a frame, neither running nor suspended. */
static int coro_unstarted(PyObject *coro)
{
    int is_coro = PyCoro_CheckExact(coro);
    if (!is_coro && !PyGen_Check(coro))
        return 1;   /* any other awaitable: no way to tell, assume new */
    PyObject *frame = PyObject_GetAttrString(coro, is_coro ? "cr_frame" : "gi_frame");
    if (!frame)
        return -1;
    int r = 0;
    if (frame != Py_None) {
#if AP_CODE_HAS_QUALNAME   /* 3.11+: cr_suspended exists and f_lasti no longer tells */
        PyObject *susp = PyObject_GetAttrString(coro, is_coro ? "cr_suspended" : "gi_suspended");
        PyObject *run = susp ? PyObject_GetAttrString(coro, is_coro ? "cr_running" : "gi_running") : NULL;
        r = run ? (PyObject_Not(susp) == 1 && PyObject_Not(run) == 1) : -1;
        Py_XDECREF(susp);
        Py_XDECREF(run);
#else                      /* 3.10: f_lasti is -1 until the first instruction runs */
        PyObject *lasti = PyObject_GetAttrString(frame, "f_lasti");
        long v = lasti ? PyLong_AsLong(lasti) : -2;
        Py_XDECREF(lasti);
        r = v == -2 ? -1 : v < 0;
#endif
    }
    Py_DECREF(frame);
    return r;
}

#define FACTORY_FRAMES 4   /* frames of the program a task factory may span */

uint32_t ap_creation_site(ap_session_t *s, const ap_thread_t *th, int *by_loop, uint32_t *via)
{
    /* Walk out from the frame that called Task(). The first frame of the program (not in
     * asyncio or aioprof) is the site, unless a few frames further out asyncio's
     * BaseEventLoop.create_task called it: then it was the loop's task factory (with the
     * helpers it calls), skipped as asyncio's frames are, and the walk goes on. Inside a
     * handle, reaching the frames that run handles (_run_once) first means that no frame of
     * the program made the task (a callback that is loop.create_task itself, compiled
     * code): never a line further out, such as the asyncio.run() that runs the loop.
     * Library frames (is_library: the rest of the standard library, site-/dist-packages,
     * computed once per code object) are walked through to the first frame of the
     * program's own code, the innermost of them kept as *via (anyio's start_soon: the
     * site is the program's tg.start_soon line). With no such frame inside the handle
     * (the library's own task), the library's line is the site, without via. */
    PyFrameObject *f = ap_current_frame();
    Py_XINCREF(f);
    uint32_t site = AP_NONE, lib = AP_NONE;
    int ahead = 0;
    *by_loop = 0;
    *via = AP_NONE;
    for (int depth = 0; f && depth < 128; depth++) {
        PyCodeObject *code = PyFrame_GetCode(f);
        uint32_t c = ap_code_get(s, (PyObject *)code);
        if (c == AP_NONE) {
            Py_DECREF(code);
            break;
        }
        ap_code_t *cr = &s->codes[c];
        if (cr->is_asyncio || cr->is_aioprof) {
            Py_DECREF(code);
            if (site != AP_NONE && !cr->is_create_task)
                break;   /* the site stands */
            site = AP_NONE;   /* (what create_task called: a task factory) */
            if (cr->is_create_task)
                lib = AP_NONE;
            /* Inside a handle, the loop's frames (or, under uvloop, which runs handles in
             * compiled code, asyncio.run's) end a walk that saw only library frames. */
            if (th->depth > 0 && (cr->is_handle_runner || (lib != AP_NONE && cr->is_loop_entry))) {
                *by_loop = lib == AP_NONE;
                break;
            }
        } else if (site == AP_NONE) {
            uint32_t here = ap_site_get(s, (PyObject *)code, PyFrame_GetLineNumber(f));
            Py_DECREF(code);
            if (here == AP_NONE)
                break;   /* out of memory */
            if (cr->is_library) {
                if (lib == AP_NONE)
                    lib = here;
            } else {
                site = here;
                ahead = 0;
            }
        } else {
            Py_DECREF(code);
            if (++ahead >= FACTORY_FRAMES)
                break;
        }
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    if (site == AP_NONE)
        return lib;   /* no frame of the program: the library's line, or none */
    *via = lib;
    return site;
}

static uint32_t coro_get(ap_session_t *s, PyObject *coro)
{
    /* Native coroutines and generators, and Cython's, which carry a code object too. */
    PyObject *code = PyObject_GetAttrString(coro, PyGen_Check(coro) ? "gi_code" : "cr_code");
    if (!code) {
        PyErr_Clear();
        return AP_NONE;   /* not a coroutine object: no per-coroutine row */
    }
    uint32_t c = PyCode_Check(code) ? ap_code_get(s, code) : AP_NONE;
    Py_DECREF(code);
    if (c == AP_NONE)
        return AP_NONE;
    if (s->codes[c].coro != AP_NONE)
        return s->codes[c].coro;
    if (ap_grow((void **)&s->coros, &s->cap_coros, sizeof(ap_coro_t), s->n_coros) < 0) {
        PyErr_NoMemory();
        return AP_NONE;
    }
    memset(&s->coros[s->n_coros], 0, sizeof(ap_coro_t));
    s->coros[s->n_coros].code = c;
#if !AP_CODE_HAS_QUALNAME
    /* 3.10: the code object only knows co_name; the coroutine knows its __qualname__. */
    PyObject *qual = PyObject_GetAttrString(coro, "__qualname__");
    if (qual && PyUnicode_Check(qual))
        Py_SETREF(s->codes[c].qualname, qual);
    else
        Py_XDECREF(qual);
    PyErr_Clear();
#endif
    s->codes[c].coro = s->n_coros;
    return s->n_coros++;
}

/* A task made by no frame of the program: name what ran, the callback or the step of a
 * task (its coroutine). */
static void creator_of(ap_session_t *s, const ap_thread_t *th, ap_task_t *t)
{
    uint32_t code = AP_NONE;
    t->by_loop = 1;
    if (th->cb != AP_NONE) {
        t->created_by = Py_NewRef(s->cbs[th->cb].name);
        code = s->cbs[th->cb].code;
    } else if (th->task && th->task->coro_idx != AP_NONE) {
        code = s->coros[th->task->coro_idx].code;
        t->created_by = Py_NewRef(s->codes[code].qualname);
    } else if (th->task && th->task->coro_name) {
        t->created_by = Py_NewRef(th->task->coro_name);
    }
    if (code != AP_NONE)
        t->created_by_file = Py_NewRef(s->codes[code].filename);
}

ap_task_t *ap_task_new(ap_session_t *s, ap_thread_t *th, PyObject *task, ap_ns_t now, int fresh_hint,
                       PyObject *coro_hint)
{
    ap_task_t *t = PyMem_RawCalloc(1, sizeof *t);
    if (!t) {
        PyErr_NoMemory();
        return NULL;
    }
    t->id = ++s->next_task_id;
    t->addr = (uintptr_t)task;
    t->thread = th->ident;
    t->coro_idx = t->created = t->created_via = t->last_site = AP_NONE;
    t->state = AP_READY;
    t->t_created = t->t_mark = now;
    t->t_first = t->t_end = -1;

    /* (3.12.1's get_coro() crashes on a task that finished eagerly, its coroutine
     * cleared: an eager task is first seen before its step, see eager_begin.) */
    PyObject *coro = coro_hint ? Py_NewRef(coro_hint) : PyObject_CallMethod(task, "get_coro", NULL);
    if (!coro)
        goto error;
    t->coro = coro;   /* borrowed from here on: the task holds it while pending */
    Py_DECREF(coro);
    t->name = PyObject_CallMethod(task, "get_name", NULL);
    if (!t->name)
        goto error;
    int fresh = fresh_hint > 0 ? 1 : coro != Py_None ? coro_unstarted(coro) : 0;
    if (fresh < 0)
        goto error;
    if (fresh) {
        int by_loop;
        t->created = ap_creation_site(s, th, &by_loop, &t->created_via);
        if (PyErr_Occurred())
            goto error;
        t->parent = th->task ? th->task->id : 0;
        if (by_loop)
            creator_of(s, th, t);
    }
    t->coro_idx = coro_get(s, coro);
    if (PyErr_Occurred())
        goto error;
    if (t->coro_idx != AP_NONE) {
        ap_coro_t *c = &s->coros[t->coro_idx];
        c->tasks++;
        t->internal = s->codes[c->code].is_internal;
    } else if (coro != Py_None) {
        /* A coroutine compiled by Cython (uvloop's shutdown_asyncgens, ...): no code
         * object, but a qualified name; uvloop's own are internal. */
        t->coro_name = PyObject_GetAttrString(coro, "__qualname__");
        if (!t->coro_name) {
            PyErr_Clear();
            t->coro_name = PyUnicode_FromString(_PyType_Name(Py_TYPE(coro)));
            if (!t->coro_name)
                goto error;
        }
        t->internal = strncmp(Py_TYPE(coro)->tp_name, "uvloop.", 7) == 0;
    }
    t->wr = PyWeakref_NewRef(task, s->wr_task_cb);
    if (!t->wr)
        goto error;
    if (ap_table_put(&s->live, t->addr, (uintptr_t)t) < 0 ||
        ap_table_put(&s->wr_tab, (uintptr_t)t->wr, (uintptr_t)t) < 0) {
        ap_table_del(&s->live, t->addr);
        PyErr_NoMemory();
        goto error;
    }
    if (s->trace)
        ap_trace_add(s, AP_EV_CREATE, t->id, t->parent, now, now, 0);
    if (s->n_kept < s->max_tasks) {
        if (ap_grow((void **)&s->tasks, &s->cap_tasks, sizeof(ap_task_t *), s->n_tasks) < 0) {
            ap_table_del(&s->live, t->addr);
            ap_table_del(&s->wr_tab, (uintptr_t)t->wr);
            PyErr_NoMemory();
            goto error;
        }
        s->tasks[s->n_tasks++] = t;
        s->n_kept++;
        t->kept = 1;
    } else {
        s->dropped++;
    }
    return t;
error:
    ap_task_free(t);
    return NULL;
}

void ap_task_refresh_name(ap_task_t *t, PyObject *task)
{
    /* asyncio.create_task(name=...) names the task after Task() scheduled it, so the
     * name seen first may be a default one: read it again when it can be reported. */
    PyObject *name = PyObject_CallMethod(task, "get_name", NULL);
    if (name)
        Py_SETREF(t->name, name);
    else
        PyErr_Clear();
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

/* Stop tracking a task that will not run again: the record stays for the report if
 * kept, otherwise it is freed. */
static void task_retire(ap_session_t *s, ap_task_t *t)
{
    s->tasks_ended[t->destroyed ? 4 : t->result]++;
    ap_table_del(&s->live, t->addr);
    if (t->wr) {
        ap_table_del(&s->wr_tab, (uintptr_t)t->wr);
        Py_CLEAR(t->wr);   /* dropping the weak reference: its callback will not run */
    }
    t->coro = NULL;
    if (!t->kept)
        ap_task_free(t);
}

PyObject *ap_task_died(PyObject *Py_UNUSED(module), PyObject *wr)
{
    ap_session_t *s = ap_session;
    if (!s)
        Py_RETURN_NONE;
    ap_task_t *t = (ap_task_t *)ap_table_get(&s->wr_tab, (uintptr_t)wr);
    if (!t)
        Py_RETURN_NONE;
    /* Destroyed while pending ("Task was destroyed but it is pending!"): close its
     * timeline now so its times still sum to its lifetime. */
    ap_ns_t now = ap_clock_wall();
    if (t->state == AP_READY)
        t->scheduled += now - t->t_mark;
    else if (t->state == AP_SUSPENDED)
        t->idle += now - t->t_mark;
    if (t->coro_idx != AP_NONE) {
        ap_coro_t *c = &s->coros[t->coro_idx];
        if (t->state == AP_READY)
            c->scheduled += now - t->t_mark;
        else if (t->state == AP_SUSPENDED)
            c->idle += now - t->t_mark;
    }
    t->state = AP_DONE;
    t->destroyed = 1;
    t->t_end = now;
    task_retire(s, t);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ await chains */

int ap_frame_line(ap_session_t *s, PyFrameObject *f, PyObject *code)
{
    /* PyFrame_GetLineNumber decodes the line table from its start (thousands of
     * instructions on 3.11); the same (code, instruction) always has the same line. */
    uintptr_t key = ap_mix2((uintptr_t)code, (uintptr_t)(unsigned)ap_frame_lasti(f) + 1);
    uintptr_t v = ap_table_get(&s->line_cache, key);
    if (v)
        return (int)(v - 1);
    int line = PyFrame_GetLineNumber(f);
    if (ap_table_put(&s->line_cache, key, (uintptr_t)(line + 1)) < 0)
        PyErr_Clear();   /* only a cache */
    return line;
}

/* The kinds of frame holders an await chain goes through, and their attributes. */
enum { K_CORO, K_GEN, K_ASYNCGEN, K_NKINDS };
static const char *const attr_names[K_NKINDS][3] = {
    {"cr_code", "cr_frame", "cr_await"},
    {"gi_code", "gi_frame", "gi_yieldfrom"},
    {"ag_code", "ag_frame", "ag_await"},
};
static PyObject *attr[K_NKINDS][3];   /* interned: [kind][code, frame, awaited] */

static int intern_names(void)
{
    if (attr[0][0])
        return 0;
    for (int k = 0; k < K_NKINDS; k++)
        for (int a = 0; a < 3; a++)
            if (!(attr[k][a] = PyUnicode_InternFromString(attr_names[k][a])))
                return -1;
    return 0;
}

/* The site of the frame `obj` (a coroutine, generator or async generator of kind `k`)
 * is suspended at. */
static uint32_t suspended_site(ap_session_t *s, PyObject *obj, PyObject *code, int k)
{
    PyObject *frame = PyObject_GetAttr(obj, attr[k][1]);
    if (!frame)
        return AP_NONE;
    uint32_t site = AP_NONE;
    if (frame != Py_None)
        site = ap_site_get(s, code, ap_frame_line(s, (PyFrameObject *)frame, code));
    Py_DECREF(frame);
    return site;
}

static int find_asyncgen(PyObject *obj, void *found)
{
    if (obj && PyAsyncGen_CheckExact(obj)) {
        *(PyObject **)found = obj;
        return 1;   /* stop */
    }
    return 0;
}

/* `async for` awaits an async generator's asend/athrow object, which does not show its
 * generator as an attribute; its tp_traverse visits it (as gc.get_referents() does).
 * Returns the generator (new reference) or NULL. */
static PyObject *asyncgen_of_awaitable(PyObject *obj)
{
    static PyTypeObject *asend_type, *athrow_type;
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp != asend_type && tp != athrow_type) {
        if (strcmp(tp->tp_name, "async_generator_asend") == 0)
            asend_type = tp;
        else if (strcmp(tp->tp_name, "async_generator_athrow") == 0)
            athrow_type = tp;
        else
            return NULL;
    }
    PyObject *found = NULL;
    if (tp->tp_traverse)
        tp->tp_traverse(obj, find_asyncgen, &found);
    return Py_XNewRef(found);
}

/* ---- awaitables that are not async def coroutines */

#define N_TYPE_CACHE 16

/* Is `tp` an asyncio future type (what a chain ends at)? They all have the class
 * attribute _asyncio_future_blocking. Cached per type (strong references: few types). */
static int is_future_type(PyTypeObject *tp)
{
    static PyTypeObject *types[N_TYPE_CACHE];
    static char future[N_TYPE_CACHE];
    static int n;
    for (int i = 0; i < n; i++)
        if (types[i] == tp)
            return future[i];
    int r = PyObject_HasAttrString((PyObject *)tp, "_asyncio_future_blocking");
    if (n < N_TYPE_CACHE) {
        types[n] = (PyTypeObject *)Py_NewRef((PyObject *)tp);
        future[n++] = (char)r;
    }
    return r;
}

static int is_coroutine_like(PyObject *o)
{
    return PyCoro_CheckExact(o) || PyGen_Check(o) || PyAsyncGen_CheckExact(o) ||
           strcmp(Py_TYPE(o)->tp_name, "coroutine_wrapper") == 0;
}

typedef struct {
    PyObject *found;
    PyObject *const *seen;
    int n_seen;
} find_t;

static int seen_in(const find_t *f, PyObject *o)
{
    for (int i = 0; i < f->n_seen; i++)
        if (f->seen[i] == o)
            return 1;
    return 0;
}

/* tp_traverse visitor: the first coroutine, generator or coroutine_wrapper referred to,
 * directly (a __slots__ member, what a coroutine_wrapper wraps) or as a value of the
 * instance dict; not one already on the chain. */
static int find_coroutine(PyObject *o, void *arg)
{
    find_t *f = arg;
    if (!o || f->found)
        return f->found != NULL;
    if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (!f->found && PyDict_Next(o, &pos, &k, &v))
            if (is_coroutine_like(v) && !seen_in(f, v))
                f->found = v;
    } else if (!PyType_Check(o) && is_coroutine_like(o) && !seen_in(f, o)) {
        f->found = o;
    }
    return f->found != NULL;
}

/* What an awaitable that is neither a coroutine, a generator nor an async generator is
 * waiting on (new reference), or NULL (no error) when the chain ends at it: a Cython
 * coroutine or generator (its cr_await / gi_yieldfrom), the coroutine_wrapper that
 * coro.__await__() returns, an object of a Python class that drives a coroutine it
 * holds (a custom coroutine class, an __await__ iterator). An asyncio future ends it.
 * seen: the chain's objects so far, never gone back to. */
static PyObject *awaited_by_other(PyObject *obj, PyObject *const *seen, int n_seen)
{
    PyTypeObject *tp = Py_TYPE(obj);
    int fut = is_future_type(tp);
    if (fut != 0) {
        PyErr_Clear();
        return NULL;
    }
    static const char *const links[] = {"cr_await", "gi_yieldfrom"};
    for (int i = 0; i < 2; i++) {
        /* Looked up on the type first: no __getattr__ of the program runs. */
        PyObject *d = PyObject_GetAttrString((PyObject *)tp, links[i]);
        if (!d) {
            PyErr_Clear();
            continue;
        }
        Py_DECREF(d);
        PyObject *next = PyObject_GetAttrString(obj, links[i]);
        if (!next || next == Py_None) {
            Py_XDECREF(next);
            PyErr_Clear();
            return NULL;
        }
        return next;
    }
    find_t f = {NULL, seen, n_seen};
    if (tp->tp_traverse)
        tp->tp_traverse(obj, find_coroutine, &f);
    return Py_XNewRef(f.found);
}

/* Walk the await chain of `coro` (outermost first) into out[]; frames in asyncio's
 * own package are dropped unless nothing else is left. Their code is read through
 * cr_code, which is cheap; only the kept frames' lines are computed. Async generators
 * driven by `async for` are followed into. Returns the count, -1 on error. */
static int walk_chain(ap_session_t *s, PyObject *coro, uint32_t *out)
{
    if (intern_names() < 0)
        return -1;
    int n = 0;
    PyObject *last_asyncio = NULL, *last_asyncio_code = NULL;
    int last_kind = K_CORO;
    PyObject *seen[64];   /* the chain's objects (borrowed, compared only) */
    int n_seen = 0;
    PyObject *cur = Py_NewRef(coro);
    for (int depth = 0; cur && cur != Py_None && depth < 256; depth++) {
        if (n_seen < 64)
            seen[n_seen++] = cur;
        int k = PyCoro_CheckExact(cur) ? K_CORO : PyGen_Check(cur) ? K_GEN : PyAsyncGen_CheckExact(cur) ? K_ASYNCGEN : -1;
        if (k < 0) {
            PyObject *gen = asyncgen_of_awaitable(cur);
            if (!gen) {
                /* Not an async def coroutine: follow it to what it awaits, if it says. */
                PyObject *next = awaited_by_other(cur, seen, n_seen);
                if (!next)
                    break;   /* a Future or another awaitable: the chain ends here */
                Py_SETREF(cur, next);
                continue;
            }
            Py_SETREF(cur, gen);
            k = K_ASYNCGEN;
        }
        PyObject *code = PyObject_GetAttr(cur, attr[k][0]);
        if (!code)
            goto error;
        uint32_t c = ap_code_get(s, code);
        if (c == AP_NONE) {
            Py_DECREF(code);
            goto error;
        }
        if (s->codes[c].is_asyncio) {
            Py_XSETREF(last_asyncio, Py_NewRef(cur));
            Py_XSETREF(last_asyncio_code, code);
            last_kind = k;
        } else {
            uint32_t site = suspended_site(s, cur, code, k);
            Py_DECREF(code);
            if (site != AP_NONE) {
                /* Too long: keep the innermost AP_MAX_CHAIN lines, the await site last. */
                if (n == AP_MAX_CHAIN) {
                    memmove(out, out + 1, (AP_MAX_CHAIN - 1) * sizeof *out);
                    n--;
                }
                out[n++] = site;
            } else if (PyErr_Occurred()) {
                goto error;
            }
        }
        PyObject *next = PyObject_GetAttr(cur, attr[k][2]);
        if (!next)
            goto error;
        Py_SETREF(cur, next);
    }
    Py_XDECREF(cur);
    if (n == 0 && last_asyncio) {
        uint32_t site = suspended_site(s, last_asyncio, last_asyncio_code, last_kind);
        if (site != AP_NONE)
            out[n++] = site;
    }
    Py_XDECREF(last_asyncio);
    Py_XDECREF(last_asyncio_code);
    return PyErr_Occurred() ? -1 : n;
error:
    Py_XDECREF(cur);
    Py_XDECREF(last_asyncio);
    Py_XDECREF(last_asyncio_code);
    return -1;
}

uint32_t ap_chain_of(ap_session_t *s, PyObject *coro)
{
    uint32_t sites[AP_MAX_CHAIN];
    int n = walk_chain(s, coro, sites);
    return n <= 0 ? AP_NONE : chain_get(s, sites, (uint32_t)n);
}

uint32_t ap_chain_site(ap_session_t *s, uint32_t chain)
{
    return chain == AP_NONE ? AP_NONE : s->chains[chain].sites[s->chains[chain].n - 1];
}

uint32_t ap_chain_user_site(ap_session_t *s, uint32_t chain)
{
    for (uint32_t i = chain == AP_NONE ? 0 : s->chains[chain].n; i-- > 0;) {
        uint32_t site = s->chains[chain].sites[i];
        if (!s->codes[s->sites[site].code].is_library)
            return site;
    }
    return AP_NONE;
}

int ap_chain_charge(ap_session_t *s, ap_task_t *t, uint32_t chain, ap_ns_t idle)
{
    ap_chain_t *c = &s->chains[chain];
    for (uint32_t i = 0; i < c->n; i++) {
        int dup = 0;   /* recursion can put a line twice on one chain: charge it once */
        for (uint32_t j = 0; j < i && !dup; j++)
            dup = c->sites[j] == c->sites[i];
        if (dup)
            continue;
        s->sites[c->sites[i]].count++;
        s->sites[c->sites[i]].idle += idle;
    }
    s->sites[c->sites[c->n - 1]].inner_count++;
    s->sites[c->sites[c->n - 1]].inner_idle += idle;
    uint32_t i = 0;
    while (i < t->n_awaits && t->awaits[i].chain != chain)
        i++;
    if (i == t->n_awaits) {
        if (ap_grow((void **)&t->awaits, &t->cap_awaits, sizeof(ap_await_t), i) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        t->awaits[i].chain = chain;
        t->n_awaits++;
    }
    t->awaits[i].count++;
    t->awaits[i].idle += idle;
    return 0;
}

/* ------------------------------------------------------------------ transitions */

void ap_task_wake(ap_session_t *s, ap_thread_t *Py_UNUSED(th), ap_task_t *t, ap_ns_t ready, ap_ns_t now)
{
    if (t->state == AP_RUNNING) {
        t->woke_in_step = 1;   /* a bare yield (sleep(0)): ready again when the step ends */
        return;
    }
    if (t->state != AP_SUSPENDED)
        return;                /* already ready: the earliest wake-up counts */
    if (ready < t->t_mark || ready > now)
        ready = ready < t->t_mark ? t->t_mark : now;
    ap_ns_t idle = ready - t->t_mark;
    t->idle += idle;
    t->susp_idle = idle;
    t->t_susp = t->t_mark;
    t->need_walk = 1;
    if (t->coro_idx != AP_NONE)
        s->coros[t->coro_idx].idle += idle;
    t->state = AP_READY;
    t->t_mark = ready;
}

void ap_task_step_begin(ap_session_t *s, ap_thread_t *Py_UNUSED(th), ap_task_t *t, PyObject *task, ap_ns_t now)
{
    ap_coro_t *c = t->coro_idx != AP_NONE ? &s->coros[t->coro_idx] : NULL;
    ap_ns_t ready = now;
    if (t->state == AP_SUSPENDED) {
        /* woken by a path aioprof did not see (e.g. an eager start): all idle */
        ap_ns_t idle = now - t->t_mark;
        t->idle += idle;
        t->susp_idle = idle;
        t->t_susp = t->t_mark;
        t->need_walk = 1;
        if (c)
            c->idle += idle;
    } else if (t->state == AP_READY) {
        t->scheduled += now - t->t_mark;
        if (c)
            c->scheduled += now - t->t_mark;
        ready = t->t_mark;
        if (s->trace)
            ap_trace_add(s, AP_EV_SCHEDULED, t->id, 0, t->t_mark, now, 0);
    }
    if (t->need_walk) {
        /* The coroutine has not resumed yet: its await chain is still where it was
         * suspended. Walking here, not at every step end, means bare yields
         * (sleep(0)) never pay for a walk. */
        t->need_walk = 0;
        uint32_t chain = t->coro ? ap_chain_of(s, t->coro) : AP_NONE;
        if (chain != AP_NONE && ap_chain_charge(s, t, chain, t->susp_idle) == 0)
            t->last_site = ap_chain_site(s, chain);
        if (chain != AP_NONE && s->async_stacks && task)
            ap_stack_charge_idle(s, task, t, chain, t->susp_idle);
        if (s->trace)
            ap_trace_add(s, AP_EV_AWAIT, t->id, 0, t->t_susp, ready, t->last_site);
        if (PyErr_Occurred())
            ap_fault(s, "walking an await chain");
    }
    if (t->t_first < 0)
        t->t_first = now;
    t->state = AP_RUNNING;
    t->t_step = now;
    t->woke_in_step = 0;
}

int ap_task_step_end(ap_session_t *s, ap_thread_t *th, ap_task_t *t, PyObject *task, ap_ns_t now)
{
    ap_ns_t dur = now - t->t_step;
    t->busy += dur;
    t->steps++;
    if (dur > t->max_step)
        t->max_step = dur;
    if (t->coro_idx != AP_NONE) {
        ap_coro_t *c = &s->coros[t->coro_idx];
        c->busy += dur;
        c->steps++;
        if (dur > c->max_step)
            c->max_step = dur;
        if (ap_hist_add(&c->hist, dur) < 0)
            ap_fault(s, "out of memory in a histogram");
    }
    /* The CPU weight is the step's busy time, less what was queued already in segments
     * before the eager steps it ran (see "eager tasks" below). */
    ap_ns_t weight = dur - th->charged;
    th->charged = 0;
    ap_cpu_charge(s, th, (ap_cpu_item_t){t->kept ? t : NULL, t->coro_idx, AP_NONE, NULL, weight > 0 ? weight : 0}, now);
    t->t_mark = now;
    if (t->woke_in_step) {
        t->state = AP_READY;
        t->yields++;
        return AP_READY;
    }
    /* Not rescheduled by its own step: suspended on something, or finished. */
    static PyObject *str_done;
    if (!str_done && !(str_done = PyUnicode_InternFromString("done"))) {
        ap_fault(s, "interning a name");
        return t->state;
    }
    PyObject *r = PyObject_CallMethodNoArgs(task, str_done);
    if (!r) {
        ap_fault(s, "calling Task.done()");
        return t->state;
    }
    int done = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (!done) {
        t->state = AP_SUSPENDED;
        return AP_SUSPENDED;
    }
    t->state = AP_DONE;
    t->t_end = now;
    ap_task_refresh_name(t, task);
    r = PyObject_CallMethod(task, "cancelled", NULL);
    if (r && PyObject_IsTrue(r)) {
        t->result = AP_R_CANCELLED;
    } else if (r) {
        /* Not task.exception(): that marks the exception retrieved, and asyncio would no
         * longer log "Task exception was never retrieved". The _exception attribute of
         * both the C and the Python Future reads it without a side effect. */
        PyObject *exc = PyObject_GetAttrString(task, "_exception");
        if (!exc && PyErr_ExceptionMatches(PyExc_AttributeError))
            PyErr_Clear();
        if (exc && exc != Py_None) {
            t->result = AP_R_FAILED;
            t->exc_name = PyUnicode_FromString(_PyType_Name(Py_TYPE(exc)));
        } else {
            t->result = AP_R_DONE;
        }
        Py_XDECREF(exc);
    }
    Py_XDECREF(r);
    if (PyErr_Occurred())
        ap_fault(s, "reading a finished task's result");
    task_retire(s, t);   /* frees t unless kept: the caller must not touch it */
    return AP_DONE;
}

/* ------------------------------------------------------------------ callbacks */

uint32_t ap_cb_get(ap_session_t *s, PyObject *cb)
{
    /* Unwrap functools.partial and bound methods down to a function when possible. */
    PyObject *fn = cb;
    for (int i = 0; i < 4; i++) {
        if (PyMethod_Check(fn)) {
            fn = PyMethod_GET_FUNCTION(fn);
        } else if (!PyFunction_Check(fn) && !PyCFunction_Check(fn) &&
                   strcmp(Py_TYPE(fn)->tp_name, "functools.partial") == 0) {
            PyObject *inner = PyObject_GetAttrString(fn, "func");
            if (!inner) {
                PyErr_Clear();
                break;
            }
            Py_DECREF(inner);   /* the partial keeps it alive */
            fn = inner;
        } else {
            break;
        }
    }
    uintptr_t key;
    PyObject *code = NULL;
    if (PyFunction_Check(fn)) {
        code = PyFunction_GET_CODE(fn);
        key = (uintptr_t)code;
    } else if (PyCFunction_Check(fn)) {
        key = ap_mix2((uintptr_t)((PyCFunctionObject *)fn)->m_ml, 1);
    } else {
        key = ap_mix2((uintptr_t)Py_TYPE(fn), 2);
    }
    uintptr_t v = ap_table_get(&s->cb_idx, key);
    if (v)
        return (uint32_t)(v - 1);
    if (ap_grow((void **)&s->cbs, &s->cap_cbs, sizeof(ap_cb_t), s->n_cbs) < 0) {
        PyErr_NoMemory();
        return AP_NONE;
    }
    ap_cb_t *r = &s->cbs[s->n_cbs];
    memset(r, 0, sizeof *r);
    r->code = AP_NONE;
    if (code) {
        r->code = ap_code_get(s, code);
        if (r->code == AP_NONE)
            return AP_NONE;
        r->name = Py_NewRef(s->codes[r->code].qualname);
        r->internal = s->codes[r->code].is_asyncio;
    } else {
        PyObject *q = PyObject_GetAttrString(fn, "__qualname__");
        if (!q) {
            PyErr_Clear();
            q = PyUnicode_FromString(Py_TYPE(fn)->tp_name);
            if (!q)
                return AP_NONE;
        }
        r->name = q;
        /* Built-ins bound to asyncio's futures (set_result, ...) are asyncio plumbing. */
        PyObject *self = PyCFunction_Check(fn) ? PyCFunction_GET_SELF(fn) : NULL;
        r->internal = self && PyModule_Check(self) == 0 &&
                      strncmp(Py_TYPE(self)->tp_name, "_asyncio.", 9) == 0;
    }
    if (ap_table_put(&s->cb_idx, key, s->n_cbs + 1) < 0) {
        Py_CLEAR(r->name);
        PyErr_NoMemory();
        return AP_NONE;
    }
    return s->n_cbs++;
}

/* ------------------------------------------------------------------ CPU windows */

void ap_cpu_flush(ap_session_t *s, ap_thread_t *th, ap_ns_t now)
{
    ap_ns_t cpu = ap_clock_cpu();
    ap_ns_t spent = cpu - th->win_cpu, total = 0;
    for (uint32_t i = 0; i < th->n_pending; i++)
        total += th->pending[i].weight;
    /* Each item's share is capped at its weight (its wall time): the window's CPU can
     * exceed the wall time of its items, when select waits (weight 0) used the CPU too
     * (selectors' Python code around poll(), many ready events). What is over goes to
     * no row: no step spent it. So cpu <= busy holds for every task, coroutine and
     * callback. */
    for (uint32_t i = 0; i < th->n_pending && total > 0 && spent > 0; i++) {
        ap_cpu_item_t *it = &th->pending[i];
        ap_ns_t share = (ap_ns_t)((double)spent * (double)it->weight / (double)total);
        if (share > it->weight)
            share = it->weight;
        if (it->task)
            it->task->cpu += share;
        if (it->coro != AP_NONE)
            s->coros[it->coro].cpu += share;
        else if (it->cb != AP_NONE)
            s->cbs[it->cb].cpu += share;
        else if (it->loop)
            it->loop->overhead_cpu += share;
    }
    th->n_pending = 0;
    th->win_cpu = cpu;
    th->win_wall = now;
}

void ap_cpu_charge(ap_session_t *s, ap_thread_t *th, ap_cpu_item_t item, ap_ns_t now)
{
    if (th->n_pending == AP_CPU_PENDING)
        ap_cpu_flush(s, th, now);   /* full: read now (amortised over 256 handles) */
    th->pending[th->n_pending++] = item;
    if (now - th->win_wall >= s->cpu_window)
        ap_cpu_flush(s, th, now);
}

/* ------------------------------------------------------------------ eager tasks */

/* An eager task (3.12+: Task(..., eager_start=True), the eager task factory) runs its
 * first step inside Task(), in C: no handle, no call_soon. What every eager start does
 * (C and Python Task alike) is make the task its loop's current task in asyncio's
 * current-task dict (_swap_current_task) and, once the step is over, put back the task
 * that was current before. aioprof watches that dict (PyDict_AddWatcher): a task never
 * seen, whose coroutine has not started, becoming current is the start of its eager
 * first step; the dict getting its previous value back for that loop is the end.
 *
 * The first step is a step of the task like any other (busy, CPU, slow step, its first
 * suspension idle at its await site), and is left out of the step that ran Task(): the
 * creator's busy time excludes it (a creator task counts it as scheduled: it waits for
 * it, ready), and its CPU weight is queued in segments around it. So the busy times of
 * tasks and callbacks add up to the loop's. Regular steps also set
 * and delete the dict's entry: those are told apart by th->task (hook_run sets it before
 * the step runs), at the cost of one comparison. */

#if AP_HAVE_DICT_WATCH


/* The accounting item of what runs now in this thread (a task step, a callback, or the
 * loop itself between handles); 0 if nothing. */
static int running_item(ap_thread_t *th, ap_cpu_item_t *it)
{
    if (th->task)
        *it = (ap_cpu_item_t){th->task->kept ? th->task : NULL, th->task->coro_idx, AP_NONE, NULL, 0};
    else if (th->cb != AP_NONE)
        *it = (ap_cpu_item_t){NULL, AP_NONE, th->cb, NULL, 0};
    else
        return 0;
    return 1;
}

static void eager_begin(ap_session_t *s, ap_thread_t *th, PyObject *task, PyObject *key, PyObject *prev)
{
    ap_ns_t now = ap_clock_wall();
    PyObject *coro = PyObject_CallMethod(task, "get_coro", NULL);
    if (!coro)
        return;
    int fresh = coro != Py_None ? coro_unstarted(coro) : 0;
    if (fresh <= 0) {
        Py_DECREF(coro);
        return;   /* a task that existed before profiling began, run by hand: not eager */
    }
    /* Queue the CPU weight of what ran before, up to now. */
    ap_cpu_item_t it;
    if (th->depth > 0 && running_item(th, &it)) {
        it.weight = now - th->seg_start;
        if (it.weight > 0) {
            ap_cpu_charge(s, th, it, now);
            th->charged += it.weight;
        }
    } else if (th->depth == 0 && th->loop && th->last_edge > 0 && now > th->last_edge) {
        ap_cpu_charge(s, th, (ap_cpu_item_t){NULL, AP_NONE, AP_NONE, th->loop, now - th->last_edge}, now);
        th->last_edge = now;
    }
    ap_task_t *t = ap_task_new(s, th, task, now, 1, coro);   /* its parent is th->task */
    Py_DECREF(coro);
    if (!t)
        return;
    ap_eager_t *e = &th->eager[th->n_eager++];
    *e = (ap_eager_t){.t = t, .task = task, .key = key, .prev = prev, .prev_task = th->task, .prev_cb = th->cb,
                      .begin = now, .prev_nested = th->nested, .prev_charged = th->charged};
    th->task = t;
    th->cb = AP_NONE;
    th->nested = th->charged = 0;
    th->seg_start = now;
    th->depth++;
    th->step_serial++;   /* another task's step: the sampler's awaiter prefix changes */
    ap_task_step_begin(s, th, t, task, now);
}

static void eager_end(ap_session_t *s, ap_thread_t *th)
{
    ap_ns_t end = ap_clock_wall();
    ap_eager_t e = th->eager[--th->n_eager];
    ap_task_t *t = e.t;
    ap_ns_t dur = end - t->t_step;
    /* As in hook_run: read what a slow-step record needs before step_end may free t. */
    ap_slow_t rec = {.dur = dur, .task = t->kept ? t->id : 0, .coro = t->coro_idx, .cb = AP_NONE,
                     .site_start = AP_NONE, .site_end = AP_NONE, .at = e.begin - s->t0};
    uint64_t id = t->id;
    PyObject *coro = t->coro;
    int state = ap_task_step_end(s, th, t, e.task, end);   /* may free t */
    th->depth--;
    th->task = e.prev_task;
    th->cb = e.prev_cb;
    th->nested = e.prev_nested + (end - e.begin);
    th->charged = e.prev_charged;
    th->seg_start = end;
    th->step_serial++;
    if (e.prev_task && e.prev_task->state == AP_RUNNING) {
        /* The creator's step excludes this one: it waited for it, ready and not running,
         * which is scheduled time (busy + scheduled + idle stays its lifetime). */
        ap_task_t *c = e.prev_task;
        c->t_step += end - e.begin;
        c->scheduled += end - e.begin;
        if (c->coro_idx != AP_NONE)
            s->coros[c->coro_idx].scheduled += end - e.begin;
    }
    if (th->depth == 0 && th->loop)
        th->last_edge = end;
    if (s->trace)
        ap_trace_add(s, AP_EV_RUN, id, ap_trace_where(s, th->loop, th->ident), e.begin, end, AP_NONE);
    if (th->loop && dur >= s->slow_ns && !s->disabled) {
        if (state == AP_SUSPENDED && coro)
            rec.site_end = ap_chain_site(s, ap_chain_of(s, coro));
        ap_loop_slow(s, th->loop, &rec);
    }
}

#if AP_HAVE_CONTEXT_SWITCH_WATCH

/* 3.14+: the C Task keeps the running task in the thread state, not in a dict (only
 * _PyTask still swaps asyncio.tasks._current_tasks, which the dict watcher below sees).
 * But its eager start makes the task current, then enters the task's context for the
 * step and leaves it after: context switches, which aioprof's context watcher sees. A
 * switch to a context while the current task is a task never seen, whose coroutine has
 * not started, is the start of its eager first step; the switch back to the context that
 * was current before is its end (the C Task puts the previous task back before leaving
 * the context: the end is told by the context, not by the task). The common case (a
 * handle entering or leaving its context) costs one current_task() call, answered from
 * the thread state. */

static int ctx_watcher_id = -1;
static PyObject *current_task_fn;   /* strong: _asyncio.current_task */

static int eager_ctx_watch(PyContextEvent event, PyObject *ctx)
{
    ap_session_t *s = ap_session;
    if (!s || s->disabled || event != Py_CONTEXT_SWITCHED || !current_task_fn)
        return 0;
    ap_thread_t *th = ap_thread_peek(s);   /* no record yet: no hook ran here, no handle runs */
    if (!th)
        return 0;
    PyObject *prev = th->cur_ctx;
    th->cur_ctx = ctx;
    int end = th->n_eager > 0 && th->eager[th->n_eager - 1].prev == ctx;
    if (!end && (th->depth == 0 || th->n_eager >= AP_MAX_EAGER || !ctx || ctx == Py_None))
        return 0;   /* eager starts happen inside handles (the loop must be running) */
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    if (end) {
        eager_end(s, th);
    } else {
        PyObject *cur = PyObject_CallNoArgs(current_task_fn);   /* this thread's running task */
        if (!cur)
            PyErr_Clear();
        else if (cur != Py_None && !(th->task && th->task->addr == (uintptr_t)cur) && is_task(s, cur) &&
                 !ap_task_find(s, cur))
            eager_begin(s, th, cur, ctx, prev);
        Py_XDECREF(cur);   /* the task lives on: Task() is running it */
    }
    if (PyErr_Occurred())
        ap_fault(s, "accounting an eager task step");
    ap_exc_restore(&exc);
    return 0;
}

static void ctx_watch_start(void)
{
    if (!current_task_fn) {
        PyObject *m = PyImport_ImportModule("_asyncio");
        current_task_fn = m ? PyObject_GetAttrString(m, "current_task") : NULL;
        Py_XDECREF(m);
        PyErr_Clear();
        if (!current_task_fn)
            return;   /* no C asyncio: eager first steps go unseen */
    }
    if (ctx_watcher_id < 0 && (ctx_watcher_id = PyContext_AddWatcher(eager_ctx_watch)) < 0)
        PyErr_Clear();   /* every watcher slot is taken: eager first steps go unseen */
}

static void ctx_watch_stop(void)
{
    if (ctx_watcher_id >= 0 && PyContext_ClearWatcher(ctx_watcher_id) < 0)
        PyErr_Clear();
    ctx_watcher_id = -1;
}

#endif

static int watcher_id = -1;
static PyObject *watched[2];   /* strong: the current-task dicts being watched */

static int eager_watch(PyDict_WatchEvent event, PyObject *dict, PyObject *key, PyObject *value)
{
    ap_session_t *s = ap_session;
    if (!s || s->disabled || (event != PyDict_EVENT_ADDED && event != PyDict_EVENT_MODIFIED &&
                              event != PyDict_EVENT_DELETED))
        return 0;
    ap_thread_t *th = ap_thread_get(s);
    if (!th)
        return 0;
    if (th->n_eager == 0 && (!value || (th->task && th->task->addr == (uintptr_t)value)))
        return 0;   /* a regular step entering or leaving: the common case */
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    PyObject *prev = PyDict_GetItemWithError(dict, key);   /* borrowed; before the change */
    PyErr_Clear();
    if (th->n_eager > 0 && th->eager[th->n_eager - 1].key == key && th->eager[th->n_eager - 1].prev == value) {
        eager_end(s, th);
    } else if (value && th->n_eager < AP_MAX_EAGER && is_task(s, value) && !ap_task_find(s, value)) {
        eager_begin(s, th, value, key, prev);
    }
    if (PyErr_Occurred())
        ap_fault(s, "accounting an eager task step");
    ap_exc_restore(&exc);
    return 0;
}

int ap_eager_watch_start(ap_session_t *Py_UNUSED(s))
{
#if AP_HAVE_CONTEXT_SWITCH_WATCH
    ctx_watch_start();
#endif
    if (watcher_id < 0 && (watcher_id = PyDict_AddWatcher(eager_watch)) < 0) {
        PyErr_Clear();   /* every watcher slot is taken: eager first steps go unseen */
        return 0;
    }
    static const char *const where[2][2] = {{"_asyncio", "_current_tasks"}, {"asyncio.tasks", "_current_tasks"}};
    for (int i = 0; i < 2; i++) {
        PyObject *m = PyImport_ImportModule(where[i][0]);
        PyObject *d = m ? PyObject_GetAttrString(m, where[i][1]) : NULL;
        Py_XDECREF(m);
        PyErr_Clear();
        if (d && PyDict_CheckExact(d) && d != watched[0] && PyDict_Watch(watcher_id, d) == 0)
            watched[i] = d;
        else
            Py_XDECREF(d);
        PyErr_Clear();
    }
    return 0;
}

void ap_eager_watch_stop(void)
{
#if AP_HAVE_CONTEXT_SWITCH_WATCH
    ctx_watch_stop();
#endif
    for (int i = 0; i < 2; i++) {
        if (watched[i] && PyDict_Unwatch(watcher_id, watched[i]) < 0)
            PyErr_Clear();
        Py_CLEAR(watched[i]);
    }
}

#else   /* 3.10, 3.11: no eager tasks */

int ap_eager_watch_start(ap_session_t *Py_UNUSED(s)) { return 0; }
void ap_eager_watch_stop(void) {}

#endif
