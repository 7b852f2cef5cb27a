/* tasks.c - per-task and per-coroutine accounting, await-chain charges, creation sites,
 * callbacks, and the CPU windows.
 *
 * A task's life is a small state machine driven by the hooks (docs/design.md):
 * READY -> RUNNING -> SUSPENDED -> READY ... -> DONE. Every transition adds the time
 * since the last one to exactly one of busy, scheduled or idle, so the three always
 * sum to the task's lifetime. */
#include "profile.h"

#include <string.h>

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
        else if (cur != Py_None && !(th->task && th->task->addr == (uintptr_t)cur) && ap_is_task(s, cur) &&
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
    } else if (value && th->n_eager < AP_MAX_EAGER && ap_is_task(s, value) && !ap_task_find(s, value)) {
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
