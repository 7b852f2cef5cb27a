/* code.c - code, site and await-chain interning, frame lines, and which callbacks are
 * task steps: what both the task accounting (tasks.c) and the async stacks (stacks.c)
 * need, below both (docs/design.md, "Layers"). */
#include "profile.h"

#include <string.h>

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

int ap_is_task(ap_session_t *s, PyObject *obj)
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
        if (!ap_is_task(s, self))
            return NULL;
        stepwrap_type = tp;
        return self;
    }
    if (PyCFunction_Check(cb)) {
        PyMethodDef *ml = ((PyCFunctionObject *)cb)->m_ml;
        if (ml != wakeup_def && (wakeup_def || strcmp(ml->ml_name, "task_wakeup") != 0))
            return NULL;
        PyObject *self = PyCFunction_GET_SELF(cb);
        if (!self || !ap_is_task(s, self))
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
        return ap_is_task(s, self) ? self : NULL;
    }
    return NULL;
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
