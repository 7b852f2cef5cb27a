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
    c->is_loop_entry = 0;
    if (c->is_asyncio) {
        /* Where the loop calls into handles: a sampled stack stops there. */
        static const char *const entries[] = {"_run", "_run_once", "run_forever", "run_until_complete", "run"};
        PyObject *name = PyObject_GetAttrString(code, "co_name");
        for (size_t i = 0; name && i < sizeof entries / sizeof *entries; i++)
            if (PyUnicode_CompareWithASCIIString(name, entries[i]) == 0)
                c->is_loop_entry = 1;
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

uint32_t ap_creation_site(ap_session_t *s)
{
    PyFrameObject *f = ap_current_frame();
    Py_XINCREF(f);
    uint32_t site = AP_NONE;
    for (int depth = 0; f && depth < 128; depth++) {
        PyCodeObject *code = PyFrame_GetCode(f);
        uint32_t c = ap_code_get(s, (PyObject *)code);
        if (c == AP_NONE) {
            Py_DECREF(code);
            break;
        }
        if (!s->codes[c].is_asyncio && !s->codes[c].is_aioprof) {
            site = ap_site_get(s, (PyObject *)code, PyFrame_GetLineNumber(f));
            Py_DECREF(code);
            break;
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
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
    t->coro_idx = t->created = t->last_site = AP_NONE;
    t->state = AP_READY;
    t->t_created = t->t_mark = now;
    t->t_first = t->t_end = -1;

    /* 3.12.1's get_coro() crashes on a task that finished eagerly (its coroutine is
     * cleared), hence the hint from the eager factory's frame. */
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
        t->created = ap_creation_site(s);
        if (PyErr_Occurred())
            goto error;
        t->parent = th->task ? th->task->id : 0;
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
    PyMem_RawFree(t->awaits);
    PyMem_RawFree(t);
}

/* Stop tracking a task that will not run again: the record stays for the report if
 * kept, otherwise it is freed. */
static void task_retire(ap_session_t *s, ap_task_t *t)
{
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
    PyObject *cur = Py_NewRef(coro);
    for (int depth = 0; cur && cur != Py_None && depth < 256; depth++) {
        int k = PyCoro_CheckExact(cur) ? K_CORO : PyGen_Check(cur) ? K_GEN : PyAsyncGen_CheckExact(cur) ? K_ASYNCGEN : -1;
        if (k < 0) {
            PyObject *gen = asyncgen_of_awaitable(cur);
            if (!gen)
                break;   /* a Future or another awaitable: the chain ends here */
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
    ap_cpu_charge(s, th, (ap_cpu_item_t){t->kept ? t : NULL, t->coro_idx, AP_NONE, NULL, dur}, now);
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
    for (uint32_t i = 0; i < th->n_pending && total > 0 && spent > 0; i++) {
        ap_cpu_item_t *it = &th->pending[i];
        ap_ns_t share = (ap_ns_t)((double)spent * (double)it->weight / (double)total);
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

/* An eager task (3.12+ eager_start) runs its first step inside Task(): no call_soon and
 * no handle. aioprof watches the code of asyncio's eager task factory with
 * sys.monitoring local events (profiler.py installs them): PY_START marks when the
 * factory began, PY_RETURN hands over the task, whose first step is begin..return.
 * That step also lies inside its creator's step, which includes it, as the creator did
 * run it. */
PyObject *ap_eager_begin(PyObject *Py_UNUSED(module), PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(n))
{
    ap_session_t *s = ap_session;
    ap_thread_t *th;
    if (s && !s->disabled && (th = ap_thread_get(s)) && th->n_eager < 8)
        th->eager_begin[th->n_eager++] = ap_clock_wall();
    Py_RETURN_NONE;
}

PyObject *ap_eager_end(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    ap_session_t *s = ap_session;
    ap_thread_t *th;
    if (!s || s->disabled || nargs < 3 || !(th = ap_thread_get(s)) || th->n_eager == 0)
        Py_RETURN_NONE;
    ap_ns_t begin = th->eager_begin[--th->n_eager], end = ap_clock_wall();
    PyObject *task = args[2];
    if (!is_task(s, task))
        Py_RETURN_NONE;
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    /* The factory's frame, still alive at PY_RETURN, holds the coroutine in `coro`. */
    PyObject *coro = NULL;
    PyFrameObject *f = ap_current_frame();
    PyObject *locals = f ? PyObject_GetAttrString((PyObject *)f, "f_locals") : NULL;
    if (locals) {
        coro = PyMapping_GetItemString(locals, "coro");
        Py_DECREF(locals);
    }
    PyErr_Clear();
    ap_task_t *t = ap_task_find(s, task);
    if (!t && coro) {
        t = ap_task_new(s, th, task, begin, 1, coro);
        if (t) {
            ap_task_t *prev = th->task;
            ap_task_step_begin(s, th, t, task, begin);
            ap_task_step_end(s, th, t, task, end);   /* may free t: not used after */
            th->task = prev;
        }
    } else if (t->steps == 0 && t->t_created >= begin) {
        /* It rescheduled itself during the eager step, so call_soon saw it first,
         * without a creation site: the step was begin..end and it is ready since end. */
        t->created = ap_creation_site(s);
        t->parent = th->task ? th->task->id : 0;
        t->t_created = t->t_first = begin;
        t->t_mark = end;
        t->steps = 1;
        t->yields = 1;
        t->busy += end - begin;
        t->max_step = end - begin;
        if (t->coro_idx != AP_NONE) {
            ap_coro_t *c = &s->coros[t->coro_idx];
            c->steps++;
            c->busy += end - begin;
            if (end - begin > c->max_step)
                c->max_step = end - begin;
            ap_hist_add(&c->hist, end - begin);
        }
    }
    Py_XDECREF(coro);
    if (PyErr_Occurred())
        ap_fault(s, "accounting an eager task");
    ap_exc_restore(&exc);
    Py_RETURN_NONE;
}
