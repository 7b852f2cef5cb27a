/* hooks.c - the event-loop and task hooks.
 *
 * Each hook is a C method descriptor (PyDescr_NewMethod) set on a standard-library
 * class in place of one Python method; it calls the saved original and measures
 * around it. The originals are process-wide, like the classes they come from, so
 * they live in this file's static `H` rather than in module state: a method
 * descriptor is called without its module.
 *
 * Rules every hook follows:
 *  - the original is always called, exactly once, with the same arguments, and its
 *    result or exception is returned unchanged; except that asyncio's own _call_soon and
 *    Handle._run (the two calls of every step) are done in C, the latter calling its
 *    original only when the callback raises (see run_handle, docs/design.md);
 *  - after the original returns, the session may have been stopped (by the code that
 *    just ran): compare the session and its generation before touching anything;
 *  - accounting never raises into the program: an error becomes a fault (ap_fault),
 *    and an exception in flight from the original is saved and restored around it. */
#include "monitor.h"

#include <string.h>

#define N_SEL 5
#define SELECT_SLACK_NS 100000   /* timer slack + wake-up latency tolerated past a timeout */

static struct {
    int installed;
    PyObject *handle_cls, *loop_cls, *sel_cls[N_SEL];     /* strong */
    PyObject *orig_run, *orig_call_soon, *orig_run_once, *orig_run_forever, *orig_select[N_SEL];
    PyObject *uv_loop_cls, *orig_uv_call_soon;   /* uvloop.Loop and its inherited call_soon */
    PyObject *events_dict;   /* asyncio.events.__dict__, where _call_soon finds Handle */
    int fast_run;            /* orig_run is asyncio's own: run_handle does its work in C */
    PyTypeObject *replay_type;   /* ap_replay_t, made once */
    PyObject *deque_type, *deque_append;   /* collections.deque and its append descriptor */
    int fast_call_soon;      /* orig_call_soon is asyncio's own: do its work in C */
    PyTypeObject *uv_step_type;                  /* ap_uvstep_t, made once */
} H;

static int hooks_refs;   /* a session and each open monitor hold one */

static int is_hook_def(const PyMethodDef *def);

/* The class's own attribute `name` (not an inherited one), new reference or NULL. */
static PyObject *own_attr(PyObject *cls, const char *name)
{
    PyObject *dict = PyObject_GetAttrString(cls, "__dict__");
    if (!dict)
        return NULL;
    PyObject *cur = PyMapping_GetItemString(dict, name);
    Py_DECREF(dict);
    return cur;
}


/* The monitor of the loop whose tick runs in this thread. Observers are Python code
 * and may close monitors at any time, so the pointer is trusted only while no monitor
 * was closed since it was taken (ap_monitor_epoch). */
static AP_TLS ap_monitor_t *tl_mon;
static AP_TLS uint64_t tl_mon_epoch;

static inline ap_monitor_t *tick_monitor(void)
{
    return (tl_mon && tl_mon_epoch == ap_monitor_epoch) ? tl_mon : NULL;
}

/* Re-find a monitor after Python code ran (it may have been closed). */
static inline ap_monitor_t *monitor_again(PyObject *loop, ap_monitor_t *m)
{
    return (m && ap_monitor_count && ap_monitor_find(loop) == m) ? m : NULL;
}

/* Every selectors class that defines select() itself (EpollSelector overrides the
 * one of _PollLikeSelector, for instance). */
static const char *const sel_names[N_SEL] = {"SelectSelector", "_PollLikeSelector", "EpollSelector",
                                             "DevpollSelector", "KqueueSelector"};

static PyObject *str_when, *str_timeout;
static ap_slot_t slot_callback;   /* Handle._callback */

/* Call `fn(self, *args, **kw)` from a vectorcall-style argument list. */
static PyObject *call_orig(PyObject *fn, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    PyObject *small[8];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0, total = nargs + nkw + 1;
    PyObject **buf = total <= 8 ? small : PyMem_Malloc(total * sizeof(PyObject *));
    if (!buf)
        return PyErr_NoMemory();
    buf[0] = self;
    memcpy(buf + 1, args, (nargs + nkw) * sizeof(PyObject *));
    PyObject *r = PyObject_Vectorcall(fn, buf, (size_t)(nargs + 1), kwnames);
    if (buf != small)
        PyMem_Free(buf);
    return r;
}

static inline int still_live(ap_session_t *s, uint64_t gen)
{
    return ap_session == s && s->gen == gen && !s->disabled;
}

/* ------------------------------------------------------------------ Handle._run */

static ap_slot_t slot_context, slot_args, slot_source_tb;   /* Handle's _context, _args, _source_traceback */

/* A stand-in for a handle's callback while an exception is replayed through the original
 * Handle._run: called (by the handle's own context's run()), it puts the handle's
 * callback and arguments back and raises the exception the callback raised. */
typedef struct {
    PyObject_HEAD
    PyObject *handle, *cb, *args;   /* strong; cb and args go back into the handle */
    ap_exc_state_t exc;
    int armed;
} ap_replay_t;

static void slot_set(const ap_slot_t *slot, PyObject *obj, PyObject *value)   /* steals value */
{
    PyObject **p = (PyObject **)((char *)obj + slot->offset);
    PyObject *old = *p;
    *p = value;
    Py_XDECREF(old);
}

/* Give the handle its callback and arguments back (once). */
static void replay_disarm(ap_replay_t *rp)
{
    if (!rp->armed)
        return;
    rp->armed = 0;
    PyObject *cb = rp->cb, *args = rp->args;
    rp->cb = rp->args = NULL;
    slot_set(&slot_callback, rp->handle, cb);   /* drops the handle's reference to rp */
    slot_set(&slot_args, rp->handle, args);
}

static PyObject *replay_call(PyObject *self, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kw))
{
    ap_replay_t *rp = (ap_replay_t *)self;
    if (!rp->armed) {
        PyErr_SetString(PyExc_RuntimeError, "aioprof: a replayed callback was called twice");
        return NULL;
    }
    replay_disarm(rp);   /* the caller's arguments keep rp alive */
    ap_exc_restore(&rp->exc);   /* gives the references to the interpreter */
    memset(&rp->exc, 0, sizeof rp->exc);
    return NULL;
}

static void replay_dealloc(PyObject *self)
{
    ap_replay_t *rp = (ap_replay_t *)self;
    ap_exc_drop(&rp->exc);
    Py_XDECREF(rp->handle);
    Py_XDECREF(rp->cb);
    Py_XDECREF(rp->args);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot replay_slots[] = {
    {Py_tp_dealloc, replay_dealloc},
    {Py_tp_call, replay_call},
    {0, NULL},
};

static PyType_Spec replay_spec = {"aioprof._core.ReplayedCallback", sizeof(ap_replay_t), 0, Py_TPFLAGS_DEFAULT,
                                  replay_slots};

/* The callback raised (the exception is set): run the original Handle._run with the
 * handle's callback swapped for one that puts it back and raises that exception again,
 * inside the handle's own context. The original then does exactly what it does without
 * aioprof: re-raise SystemExit and KeyboardInterrupt, or call the loop's exception
 * handler with the same message, exception and handle (whose callback, arguments and
 * context are its own again), and the traceback gets the `_run` frame it always has. */
static PyObject *replay(PyObject *handle)
{
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    ap_replay_t *rp = PyObject_New(ap_replay_t, H.replay_type);
    if (rp) {
        memset(&rp->exc, 0, sizeof rp->exc);
        rp->handle = rp->cb = rp->args = NULL;
        rp->armed = 0;
    }
    PyObject *empty = rp ? PyTuple_New(0) : NULL;
    if (!empty) {
        Py_XDECREF(rp);
        ap_exc_drop(&exc);
        return NULL;   /* out of memory: the callback's exception is lost to MemoryError */
    }
    rp->exc = exc;
    rp->handle = Py_NewRef(handle);
    rp->cb = Py_XNewRef(ap_slot_get(&slot_callback, handle));
    rp->args = Py_XNewRef(ap_slot_get(&slot_args, handle));
    rp->armed = 1;
    slot_set(&slot_callback, handle, Py_NewRef((PyObject *)rp));
    slot_set(&slot_args, handle, empty);
    PyObject *r = PyObject_CallOneArg(H.orig_run, handle);
    if (rp->armed) {   /* the original did not call it: leave the handle as it was */
        ap_exc_state_t in_flight;
        ap_exc_save(&in_flight);
        replay_disarm(rp);
        ap_exc_restore(&in_flight);
    }
    Py_DECREF(rp);
    return r;
}

/* asyncio's Handle._run, the same in 3.10-3.13:
 *
 *     try:
 *         self._context.run(self._callback, *self._args)
 *     except (SystemExit, KeyboardInterrupt):
 *         raise
 *     except BaseException as exc:
 *         ... self._loop.call_exception_handler({...})
 *
 * The try body is done here, in C (Context.run is PyContext_Enter, the call and
 * PyContext_Exit); only when it raises does the original run, through replay(). A call
 * into Python from C costs more than aioprof's whole bookkeeping of a step
 * (docs/performance.md). The one difference a program can see: the stack inside a
 * callback lacks the `Handle._run` frame (tracebacks of its exceptions still have it). */
static PyObject *run_handle(PyObject *handle)
{
    PyObject *ctx, *cb, *args, *tb;
    if (!H.fast_run || !(ctx = ap_slot_get(&slot_context, handle)) || !PyContext_CheckExact(ctx) ||
        !(cb = ap_slot_get(&slot_callback, handle)) || !(args = ap_slot_get(&slot_args, handle)) ||
        !PyTuple_CheckExact(args) || ((tb = ap_slot_get(&slot_source_tb, handle)) && tb != Py_None))
        /* (in debug mode the frames of source tracebacks taken in a callback must be
         * those of the original) */
        return PyObject_CallOneArg(H.orig_run, handle);
    /* The same references as the original's `*self._args` call holds: the callback and
     * each argument once more (sys.getrefcount() in a callback reads the same). */
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    Py_INCREF(ctx);
    Py_INCREF(cb);
    Py_INCREF(args);
    for (Py_ssize_t i = 0; i < n; i++)
        Py_INCREF(PyTuple_GET_ITEM(args, i));
    PyObject *r = NULL;
    if (PyContext_Enter(ctx) == 0) {
        r = PyObject_Vectorcall(cb, &PyTuple_GET_ITEM(args, 0), n, NULL);
        if (PyContext_Exit(ctx) < 0)
            Py_CLEAR(r);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(PyTuple_GET_ITEM(args, i));
    Py_DECREF(ctx);
    Py_DECREF(cb);
    Py_DECREF(args);
    if (!r)
        return replay(handle);
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyObject *hook_run(PyObject *handle, PyObject *Py_UNUSED(unused))
{
    ap_session_t *s = ap_session;
    ap_thread_t *th;
    if (ap_monitor_count) {
        ap_monitor_t *m = tick_monitor();
        if (m)
            ap_monitor_handle(m);
    }
    if (!s || s->disabled || !(th = ap_thread_get(s)))
        return run_handle(handle);
    uint64_t gen = s->gen;
    if (th->depth > 0) {
        /* A handle run inside another (an eager task step, or user code calling
         * _run itself): its time is part of the outer handle. */
        th->depth++;
        PyObject *r = run_handle(handle);
        if (still_live(s, gen))
            th->depth--;
        return r;
    }

    PyObject *cb = ap_slot_get(&slot_callback, handle);
    if (!cb)   /* unset: the original will raise its own AttributeError */
        return run_handle(handle);
    Py_INCREF(cb);   /* the callback may clear the slot (cancel()) while it runs */
    ap_loop_t *l = th->loop;
    ap_ns_t now = ap_clock_wall(), ready = -1, wake_ready = -1;
    int timer = 0;
    ap_task_t *t = NULL;
    uint32_t cbi = AP_NONE;
    PyObject *task = ap_task_of_callback(s, cb);   /* borrowed: cb keeps it alive */
    if (task) {
        t = ap_task_find(s, task);
        if (!t)
            t = ap_task_new(s, th, task, now, -1, NULL);
        if (t) {
            if (t->state == AP_READY)
                ready = t->t_mark;
            ap_task_step_begin(s, th, t, task, now);
        }
    } else {
        if (PyObject_TypeCheck(handle, (PyTypeObject *)s->timer_type)) {
            timer = 1;
            PyObject *when = PyObject_GetAttr(handle, str_when);
            double w = when ? PyFloat_AsDouble(when) : -1.0;
            Py_XDECREF(when);
            if (l && l->real_time && w > 0)
                ready = wake_ready = (ap_ns_t)(w * 1e9);
        } else if (l) {
            ready = ap_loop_ring_pop(l, (uintptr_t)handle);
            if (ready < 0 && th->io_end > 0)
                ready = wake_ready = th->io_end;   /* an I/O callback: ready when select returned */
        }
        cbi = ap_cb_get(s, cb);
    }
    if (PyErr_Occurred())
        ap_fault(s, "identifying a handle");
    if (l && ready >= 0)
        ap_loop_lag(l, now - ready, timer);

    ap_task_t *prev_task = th->task;
    ap_ns_t prev_ready = th->cur_ready;
    th->task = t;
    th->cb = cbi;
    th->cur_ready = wake_ready;
    th->depth++;
    ap_handle_segments_reset(th, now);
    if (th->sampled)
        ap_sampler_step(th, now, 1);
    if (l && th->last_edge > 0 && now > th->last_edge)
        ap_cpu_charge(s, th, (ap_cpu_item_t){NULL, AP_NONE, AP_NONE, l, now - th->last_edge}, now);

    PyObject *r = run_handle(handle);

    if (!still_live(s, gen)) {
        Py_DECREF(cb);
        return r;
    }
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    /* The eager first steps of tasks it created are theirs, not its (tasks.c). */
    ap_ns_t end = ap_clock_wall(), dur = end - now - th->nested;
    th->depth--;
    th->task = prev_task;
    th->cb = AP_NONE;
    th->cur_ready = prev_ready;
    th->last_edge = end;
    if (th->sampled)
        ap_sampler_step(th, end, 0);
    if (s->trace)
        ap_trace_add(s, AP_EV_RUN, t ? t->id : 0, ap_trace_where(s, l, th->ident), now, end, cbi);
    if (l)
        th->tick_handles++;
    if (t && t->state == AP_RUNNING) {
        /* Read what a slow-step record needs first: a finished task's record that is
         * not kept is freed by step_end. A dropped task is not in the report: no id. */
        ap_slow_t rec = {.dur = dur, .task = t->kept ? t->id : 0, .coro = t->coro_idx, .cb = AP_NONE,
                         .site_start = t->last_site, .site_end = AP_NONE,
                         .site_block1 = ap_sampler_blocked_at(th), .at = now - s->t0};
        PyObject *coro = t->coro;
        int state = ap_task_step_end(s, th, t, task, end);
        if (dur >= s->slow_ns && l && still_live(s, gen)) {
            if (state == AP_SUSPENDED && coro)
                rec.site_end = ap_chain_site(s, ap_chain_of(s, coro));
            ap_loop_slow(s, l, &rec);
        }
    } else if (cbi != AP_NONE) {
        ap_cb_t *c = &s->cbs[cbi];
        c->count++;
        c->busy += dur;
        if (dur > c->max_step)
            c->max_step = dur;
        ap_ns_t weight = dur - th->charged;
        th->charged = 0;
        ap_cpu_charge(s, th, (ap_cpu_item_t){NULL, AP_NONE, cbi, NULL, weight > 0 ? weight : 0}, end);
        if (dur >= s->slow_ns && l) {
            ap_slow_t rec = {.dur = dur, .coro = AP_NONE, .cb = cbi, .site_start = AP_NONE,
                             .site_end = AP_NONE, .site_block1 = ap_sampler_blocked_at(th), .at = now - s->t0};
            ap_loop_slow(s, l, &rec);
        }
    }
    if (PyErr_Occurred())
        ap_fault(s, "accounting a step");
    ap_exc_restore(&exc);
    Py_DECREF(cb);
    return r;
}

/* ------------------------------------------------------------------ BaseEventLoop._call_soon */

static PyObject *str_Handle, *str_ready, *str_append;

/* asyncio's BaseEventLoop._call_soon, the same in 3.10-3.13, done in C:
 *
 *     handle = events.Handle(callback, args, self, context)
 *     if handle._source_traceback:
 *         del handle._source_traceback[-1]
 *     self._ready.append(handle)
 *     return handle
 *
 * It runs for every call_soon and every task wake-up; doing it here saves a call into
 * Python per step (docs/performance.md). In debug mode (a source traceback was taken)
 * the handle is dropped and the original makes it, so its traceback is the one the
 * original takes. Only used when the saved original is asyncio's own (see install). */
static PyObject *call_soon_fast(PyObject *loop, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                const ap_thread_t *tick)
{
    if (!H.fast_call_soon || nargs != 3 || kwnames)
        return call_orig(H.orig_call_soon, loop, args, nargs, kwnames);
    /* Inside a tick of this loop, Handle and _ready as read at the tick's start. */
    PyObject *cls = tick && tick->tick_handle_cls ? tick->tick_handle_cls
                                                 : PyDict_GetItemWithError(H.events_dict, str_Handle);
    if (!cls)   /* asyncio.events.Handle deleted: let the original raise its error */
        return PyErr_Occurred() ? NULL : call_orig(H.orig_call_soon, loop, args, nargs, kwnames);
    if (cls != H.handle_cls && !(PyType_Check(cls) && PyType_IsSubtype((PyTypeObject *)cls,
                                                                        (PyTypeObject *)H.handle_cls)))
        return call_orig(H.orig_call_soon, loop, args, nargs, kwnames);   /* a foreign Handle */
    PyObject *ready = tick && tick->tick_ready ? Py_NewRef(tick->tick_ready) : PyObject_GetAttr(loop, str_ready);
    if (!ready)
        return NULL;
    Py_INCREF(cls);
    PyObject *argv[4] = {args[0], args[1], loop, args[2]};
    PyObject *handle = PyObject_Vectorcall(cls, argv, 4, NULL);
    Py_DECREF(cls);
    PyObject *tb = handle ? ap_slot_get(&slot_source_tb, handle) : NULL;
    if (handle && tb && tb != Py_None) {
        Py_DECREF(handle);   /* debug mode */
        Py_DECREF(ready);
        return call_orig(H.orig_call_soon, loop, args, nargs, kwnames);
    }
    if (!handle) {
        Py_DECREF(ready);
        return NULL;
    }
    PyObject *margs[2] = {ready, handle};
    PyObject *r = Py_IS_TYPE(ready, (PyTypeObject *)H.deque_type)
                      ? PyObject_Vectorcall(H.deque_append, margs, 2, NULL)
                      : PyObject_VectorcallMethod(str_append, margs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(ready);
    if (!r) {
        Py_DECREF(handle);
        return NULL;
    }
    Py_DECREF(r);
    return handle;
}

/* At a tick's first call_soon: read what call_soon_fast needs once for the rest of the
 * tick. A program that rebinds loop._ready or asyncio.events.Handle inside a tick is
 * followed from the next tick on. Never raises. */
static void tick_cache(ap_thread_t *th, PyObject *loop)
{
    th->tick_loop_obj = NULL;
    Py_CLEAR(th->tick_ready);
    Py_CLEAR(th->tick_handle_cls);
    if (!H.fast_call_soon)
        return;
    th->tick_ready = PyObject_GetAttr(loop, str_ready);
    th->tick_handle_cls = PyDict_GetItemWithError(H.events_dict, str_Handle);
    Py_XINCREF(th->tick_handle_cls);
    if (th->tick_ready && th->tick_handle_cls)
        th->tick_loop_obj = loop;
    PyErr_Clear();
}

static void tick_uncache(ap_thread_t *th)
{
    th->tick_loop_obj = NULL;
    Py_CLEAR(th->tick_ready);
    Py_CLEAR(th->tick_handle_cls);
}

static PyObject *hook_call_soon(PyObject *loop, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ap_session_t *s = ap_session;
    ap_thread_t *th = s && !s->disabled ? ap_thread_get(s) : NULL;
    uint64_t gen = s ? s->gen : 0;
    /* Inside a tick of this loop: read Handle and _ready at its first call_soon. */
    if (th && th->loop && th->loop->addr == (uintptr_t)loop && th->tick_loop_obj != loop && !th->tick_ready)
        tick_cache(th, loop);
    PyObject *r = call_soon_fast(loop, args, nargs, kwnames, th && th->tick_loop_obj == loop ? th : NULL);
    if (!r || nargs < 1 || !th || !still_live(s, gen))   /* Handle() may have run anything */
        return r;
    PyObject *task = ap_task_of_callback(s, args[0]);
    ap_task_t *t = task ? ap_task_find(s, task) : NULL;
    if (t && t->state == AP_RUNNING) {
        t->woke_in_step = 1;   /* a bare yield (sleep(0)): no clock read needed */
        return r;
    }
    ap_ns_t now = ap_clock_wall();
    /* A wake-up made by a timer callback dates from the timer's due time, one made by
     * an I/O callback from when select returned (tokio-console's "woken"). */
    ap_ns_t ready = th->cur_ready >= 0 ? th->cur_ready : now;
    if (t) {
        ap_task_wake(s, th, t, ready, now);
    } else if (task) {
        ap_task_new(s, th, task, now, -1, NULL);
    } else {
        ap_loop_t *l = th->loop && th->loop->addr == (uintptr_t)loop ? th->loop
                                                                      : ap_loop_get(s, loop, now);
        if (l)
            ap_loop_ring_push(l, (uintptr_t)r, ready);
    }
    if (PyErr_Occurred())
        ap_fault(s, "recording a call_soon");
    return r;
}

/* ------------------------------------------------------------------ BaseEventLoop._run_once */

static PyObject *hook_run_once(PyObject *loop, PyObject *Py_UNUSED(unused))
{
    ap_session_t *s = ap_session;
    ap_monitor_t *m = ap_monitor_count ? ap_monitor_find(loop) : NULL;
    ap_thread_t *th = NULL;
    int profile = s && !s->disabled && (th = ap_thread_get(s)) && th->depth == 0;
    if (!profile && !m)
        return PyObject_CallOneArg(H.orig_run_once, loop);
    uint64_t gen = profile ? s->gen : 0;
    ap_ns_t t0 = ap_clock_wall();
    ap_monitor_t *prev_mon = tl_mon;
    uint64_t prev_epoch = tl_mon_epoch;
    if (m) {
        tl_mon = m;
        tl_mon_epoch = ap_monitor_epoch;
        ap_monitor_tick_start(m, t0);   /* observers run here: re-check what they may change */
        profile = profile && still_live(s, gen);
    }
    ap_loop_t *l = profile ? ap_loop_get(s, loop, t0) : NULL;
    ap_loop_t *prev = th ? th->loop : NULL;
    if (profile && !l) {
        ap_fault(s, "registering an event loop");
        profile = 0;
    }
    if (profile) {
        th->loop = l;
        th->tick_select = th->tick_capped = 0;
        th->tick_handles = 0;
        th->io_end = 0;
        th->last_edge = t0;
    }

    PyObject *r = PyObject_CallOneArg(H.orig_run_once, loop);

    ap_exc_state_t exc;
    ap_exc_save(&exc);
    ap_ns_t t1 = ap_clock_wall();
    if (profile && still_live(s, gen)) {
        if (t1 > th->last_edge)
            ap_cpu_charge(s, th, (ap_cpu_item_t){NULL, AP_NONE, AP_NONE, l, t1 - th->last_edge}, t1);
        ap_loop_tick_end(s, th, l, t0, t1);
        if (s->trace)
            ap_trace_add(s, AP_EV_TICK, 0, ap_trace_where(s, l, th->ident), t0, t1, th->tick_handles);
        th->loop = prev;
        th->last_edge = 0;
        tick_uncache(th);
        if (PyErr_Occurred())
            ap_fault(s, "accounting a tick");
    }
    if ((m = monitor_again(loop, m)) != NULL)
        ap_monitor_tick_end(m, t1);
    tl_mon = prev_mon;
    tl_mon_epoch = prev_epoch;
    ap_exc_restore(&exc);
    return r;
}

/* ------------------------------------------------------------------ BaseEventLoop.run_forever */

static PyObject *hook_run_forever(PyObject *loop, PyObject *Py_UNUSED(unused))
{
    ap_monitor_t *m = ap_monitor_count ? ap_monitor_find(loop) : NULL;
    if (m)
        ap_monitor_loop_start(m);
    PyObject *r = PyObject_CallOneArg(H.orig_run_forever, loop);
    if ((m = monitor_again(loop, m ? m : (ap_monitor_count ? ap_monitor_find(loop) : NULL))) != NULL) {
        ap_exc_state_t exc;
        ap_exc_save(&exc);
        ap_monitor_loop_stop(m);
        ap_exc_restore(&exc);
    }
    return r;
}

/* ------------------------------------------------------------------ selector.select */

static PyObject *hook_select(PyObject *sel, PyTypeObject *cls, PyObject *const *args, size_t nargsf,
                             PyObject *kwnames)
{
    /* METH_METHOD passes the class the descriptor was made for: it names the original. */
    int which = 0;
    while (which < N_SEL - 1 && H.sel_cls[which] != (PyObject *)cls)
        which++;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    ap_session_t *s = ap_session;
    ap_thread_t *th = NULL;
    ap_monitor_t *m = ap_monitor_count ? tick_monitor() : NULL;
    int profile = s && !s->disabled && (th = ap_thread_get(s)) && th->loop && th->depth == 0;
    if (!profile && !m)
        return call_orig(H.orig_select[which], sel, args, nargs, kwnames);
    uint64_t gen = profile ? s->gen : 0;
    PyObject *timeout = nargs > 0 ? args[0] : NULL;
    for (Py_ssize_t i = 0; kwnames && !timeout && i < PyTuple_GET_SIZE(kwnames); i++)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, i), str_timeout) == 0)
            timeout = args[nargs + i];
    ap_ns_t timeout_ns = -1;
    if (timeout && timeout != Py_None) {
        double d = PyFloat_AsDouble(timeout);
        if (d == -1.0 && PyErr_Occurred())
            PyErr_Clear();   /* the original will complain about it, not us */
        else
            timeout_ns = d <= 0 ? 0 : (ap_ns_t)(d * 1e9);
    }
    /* The timeout as the selector really waits: poll and epoll round it up to whole
     * milliseconds (selectors.py: "round away from zero"), and the kernel's timer slack
     * adds up to 50 us. Oversleeping within that is not CPU starvation. */
    ap_ns_t cap_ns = timeout_ns;
    if (cap_ns > 0) {
        if (which != 0)   /* every selector but SelectSelector has ms resolution here */
            cap_ns = (cap_ns + 999999) / 1000000 * 1000000;
        cap_ns += SELECT_SLACK_NS;
    }
    ap_loop_t *l = profile ? th->loop : NULL;
    ap_ns_t t0 = ap_clock_wall();
    if (m) {
        ap_monitor_io_start(m, t0, timeout_ns, cap_ns);
        profile = profile && still_live(s, gen);
        m = tick_monitor();
    }
    if (profile && t0 > th->last_edge && th->last_edge > 0)
        ap_cpu_charge(s, th, (ap_cpu_item_t){NULL, AP_NONE, AP_NONE, l, t0 - th->last_edge}, t0);

    PyObject *r = call_orig(H.orig_select[which], sel, args, nargs, kwnames);

    ap_ns_t t1 = ap_clock_wall(), wait = t1 - t0;
    Py_ssize_t events = r && PyList_Check(r) ? PyList_GET_SIZE(r) : -1;
    if (profile && still_live(s, gen)) {
        ap_loop_select(s, l, t0, t1, cap_ns, events);
        if (s->trace)
            ap_trace_add(s, AP_EV_SELECT, 0, ap_trace_where(s, l, th->ident), t0, t1,
                         events > 0 ? (uint32_t)events : 0);
        th->tick_select += wait;
        th->tick_capped += (cap_ns >= 0 && wait > cap_ns) ? cap_ns : wait;
        th->io_end = t1;
        th->last_edge = t1;
    }
    if (m && (m = tick_monitor()) != NULL) {
        ap_exc_state_t exc;
        ap_exc_save(&exc);
        ap_monitor_io_end(m, t1, events);
        ap_exc_restore(&exc);
    }
    return r;
}

/* ------------------------------------------------------------------ uvloop */

/* uvloop runs its handles in Cython, out of reach of the hooks above. Its Python
 * subclass uvloop.Loop takes attributes, so call_soon is hooked there: when the callback
 * is a task's step or wake-up, uvloop is handed this small callable instead, which runs
 * the real callback and times it as hook_run does. The task, its coroutine and the loop
 * keep their types. */
typedef struct {
    PyObject_HEAD
    PyObject *cb;      /* the task's step/wake-up callable (it holds the task) */
    PyObject *loop;
    vectorcallfunc vectorcall;
} ap_uvstep_t;

/* A uvloop step timed for the loop's monitor only (no session, or not profiled). */
static PyObject *uvstep_monitored(ap_uvstep_t *w, ap_monitor_t *m, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames)
{
    ap_monitor_step_begin(m, ap_clock_wall());
    PyObject *r = PyObject_Vectorcall(w->cb, args, nargsf, kwnames);
    if ((m = monitor_again(w->loop, m)) != NULL)
        ap_monitor_step_end(m, ap_clock_wall());
    return r;
}

static PyObject *uvstep_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ap_uvstep_t *w = (ap_uvstep_t *)self;
    ap_session_t *s = ap_session;
    ap_thread_t *th;
    PyObject *task;
    ap_monitor_t *m = ap_monitor_count ? ap_monitor_find(w->loop) : NULL;
    if (!s || s->disabled || !(th = ap_thread_get(s)) || th->depth > 0 ||
        !(task = ap_task_of_callback(s, w->cb)))
        return m ? uvstep_monitored(w, m, args, nargsf, kwnames) : PyObject_Vectorcall(w->cb, args, nargsf, kwnames);
    /* task is borrowed: w->cb holds it, and uvloop holds w while calling it. No extra
     * reference: the program can see refcounts (sys.getrefcount). */
    uint64_t gen = s->gen;
    ap_ns_t now = ap_clock_wall();
    ap_task_t *t = ap_task_find(s, task);
    if (!t)
        t = ap_task_new(s, th, task, now, -1, NULL);
    ap_loop_t *l = ap_loop_get(s, w->loop, now);
    if (t) {
        if (l && t->state == AP_READY)
            ap_loop_lag(l, now - t->t_mark, 0);
        ap_task_step_begin(s, th, t, task, now);
    }
    if (PyErr_Occurred())
        ap_fault(s, "starting a uvloop step");
    ap_task_t *prev = th->task;
    th->task = t;
    th->depth++;
    ap_handle_segments_reset(th, now);
    if (th->sampled)
        ap_sampler_step(th, now, 1);
    if ((m = monitor_again(w->loop, m)) != NULL)   /* ap_task_new may have run Python code */
        ap_monitor_step_begin(m, now);
    PyObject *r = PyObject_Vectorcall(w->cb, args, nargsf, kwnames);
    if (still_live(s, gen)) {
        ap_exc_state_t exc;
        ap_exc_save(&exc);
        ap_ns_t end = ap_clock_wall();
        th->depth--;
        th->task = prev;
        if (th->sampled)
            ap_sampler_step(th, end, 0);
        if (s->trace)
            ap_trace_add(s, AP_EV_RUN, t ? t->id : 0, ap_trace_where(s, l, th->ident), now, end, AP_NONE);
        if (t && t->state == AP_RUNNING) {
            /* As in hook_run: step_end may free the record of a finished, unkept task. */
            ap_ns_t dur = end - now - th->nested;   /* eager first steps run inside are theirs */
            ap_slow_t rec = {.dur = dur, .task = t->kept ? t->id : 0, .coro = t->coro_idx,
                             .cb = AP_NONE, .site_start = t->last_site, .site_end = AP_NONE,
                             .site_block1 = ap_sampler_blocked_at(th), .at = now - s->t0};
            PyObject *coro = t->coro;
            int state = ap_task_step_end(s, th, t, task, end);
            if (dur >= s->slow_ns && l && still_live(s, gen)) {
                if (state == AP_SUSPENDED && coro)
                    rec.site_end = ap_chain_site(s, ap_chain_of(s, coro));
                ap_loop_slow(s, l, &rec);
            }
        }
        if (l) {
            l->handles++;
            l->step_busy += end - now;
            l->last_tick_end = end;
        }
        if (PyErr_Occurred())
            ap_fault(s, "accounting a uvloop step");
        ap_exc_restore(&exc);
    }
    if ((m = monitor_again(w->loop, m)) != NULL)
        ap_monitor_step_end(m, ap_clock_wall());   /* never raises */
    return r;
}

static PyObject *uvstep_repr(PyObject *self)
{
    return PyObject_Repr(((ap_uvstep_t *)self)->cb);   /* what uvloop's debug output would show */
}

static int uvstep_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(((ap_uvstep_t *)self)->cb);
    Py_VISIT(((ap_uvstep_t *)self)->loop);
    return 0;
}

static int uvstep_clear(PyObject *self)
{
    Py_CLEAR(((ap_uvstep_t *)self)->cb);
    Py_CLEAR(((ap_uvstep_t *)self)->loop);
    return 0;
}

static void uvstep_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    uvstep_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* uvloop's debug output names a task step by cb.__self__ (its _format_handle mirrors
 * asyncio's): answer with the wrapped callback's. */
static PyObject *uvstep_get_self(PyObject *self, void *Py_UNUSED(closure))
{
    return PyObject_GetAttrString(((ap_uvstep_t *)self)->cb, "__self__");
}

static PyGetSetDef uvstep_getset[] = {
    {"__self__", uvstep_get_self, NULL, "the wrapped callback's __self__ (the task)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef uvstep_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(ap_uvstep_t, vectorcall), READONLY, NULL},
    {"__wrapped__", T_OBJECT_EX, offsetof(ap_uvstep_t, cb), READONLY, "the task's own callback"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot uvstep_slots[] = {
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_repr, uvstep_repr},
    {Py_tp_traverse, uvstep_traverse},
    {Py_tp_clear, uvstep_clear},
    {Py_tp_dealloc, uvstep_dealloc},
    {Py_tp_members, uvstep_members},
    {Py_tp_getset, uvstep_getset},
    {0, NULL},
};

static PyType_Spec uvstep_spec = {
    .name = "aioprof._core.UvloopStep",
    .basicsize = sizeof(ap_uvstep_t),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = uvstep_slots,
};

static PyObject *hook_uv_call_soon(PyObject *loop, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ap_session_t *s = ap_session;
    ap_thread_t *th = NULL;
    PyObject *task;
    /* Task steps are wrapped for a session and for the loop's monitor (its busy time). */
    int profile = s && !s->disabled && (th = ap_thread_get(s));
    int monitored = ap_monitor_count && ap_monitor_find(loop);
    if (nargs < 1 || (!profile && !monitored) || !(task = ap_task_of_callback(profile ? s : NULL, args[0])))
        return call_orig(H.orig_uv_call_soon, loop, args, nargs, kwnames);
    ap_uvstep_t *w = PyObject_GC_New(ap_uvstep_t, H.uv_step_type);
    if (!w) {
        if (profile)
            ap_fault(s, "wrapping a uvloop step");
        else
            PyErr_Clear();
        return call_orig(H.orig_uv_call_soon, loop, args, nargs, kwnames);
    }
    w->cb = Py_NewRef(args[0]);
    w->loop = Py_NewRef(loop);
    w->vectorcall = uvstep_call;
    PyObject_GC_Track((PyObject *)w);
    /* Same bookkeeping as hook_call_soon: a wake-up or a new task. */
    ap_task_t *t = profile ? ap_task_find(s, task) : NULL;
    if (!profile) {
        /* monitor only: nothing to record at call_soon */
    } else if (t && t->state == AP_RUNNING) {
        t->woke_in_step = 1;
    } else {
        ap_ns_t now = ap_clock_wall();
        if (t)
            ap_task_wake(s, th, t, now, now);
        else
            ap_task_new(s, th, task, now, -1, NULL);
        ap_loop_t *l = ap_loop_get(s, loop, now);
        if (l)
            l->uvloop = 1;
    }
    if (profile && PyErr_Occurred())
        ap_fault(s, "recording a uvloop call_soon");
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *small[8], **buf = nargs + nkw <= 8 ? small : PyMem_Malloc((nargs + nkw) * sizeof(PyObject *));
    PyObject *r;
    if (!buf) {
        r = PyErr_NoMemory();
    } else {
        memcpy(buf, args, (nargs + nkw) * sizeof(PyObject *));
        buf[0] = (PyObject *)w;
        r = call_orig(H.orig_uv_call_soon, loop, buf, nargs, kwnames);
        if (buf != small)
            PyMem_Free(buf);
    }
    Py_DECREF(w);
    return r;
}

static PyMethodDef def_uv_call_soon = {"call_soon", (PyCFunction)(void (*)(void))hook_uv_call_soon,
                                       METH_FASTCALL | METH_KEYWORDS, "aioprof hook around uvloop's call_soon."};

/* Hook uvloop.Loop.call_soon if the program has imported uvloop (never imported here:
 * aioprof.profiler calls ap_hooks_uvloop when the program imports it later). 0, or -1
 * with an error set. */
static int uv_install(void)
{
    PyObject *name = PyUnicode_FromString("uvloop");
    PyObject *uv = name ? PyImport_GetModule(name) : NULL;
    Py_XDECREF(name);
    if (!uv) {
        PyErr_Clear();   /* not imported (or a broken uvloop: the program will find out) */
        return 0;
    }
    PyObject *cls = PyObject_GetAttrString(uv, "Loop");
    Py_DECREF(uv);
    if (!cls || !PyType_Check(cls) || !(((PyTypeObject *)cls)->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        PyErr_Clear();
        Py_XDECREF(cls);
        return 0;
    }
    Py_XSETREF(H.uv_loop_cls, cls);
    if (!H.uv_step_type && !(H.uv_step_type = (PyTypeObject *)PyType_FromSpec(&uvstep_spec)))
        return -1;
    /* call_soon is inherited from the Cython base class; the hook goes on the subclass
     * and is deleted from it again on uninstall. */
    PyObject *orig = PyObject_GetAttrString(H.uv_loop_cls, "call_soon");
    if (orig && Py_IS_TYPE(orig, &PyMethodDescr_Type) &&
        ((PyMethodDescrObject *)orig)->d_method == &def_uv_call_soon) {
        Py_DECREF(orig);   /* still ours from a session whose stop left it (wrapped): keep it */
        return 0;
    }
    PyObject *descr = orig ? PyDescr_NewMethod((PyTypeObject *)H.uv_loop_cls, &def_uv_call_soon) : NULL;
    int rc = descr ? PyObject_SetAttrString(H.uv_loop_cls, "call_soon", descr) : -1;
    Py_XDECREF(descr);
    if (rc < 0) {
        Py_XDECREF(orig);
        return -1;
    }
    Py_XSETREF(H.orig_uv_call_soon, orig);
    return 0;
}

static void uv_uninstall(void)
{
    if (!H.uv_loop_cls || !H.orig_uv_call_soon)
        return;
    PyObject *cur = own_attr(H.uv_loop_cls, "call_soon");
    int ours = cur && Py_IS_TYPE(cur, &PyMethodDescr_Type) &&
               ((PyMethodDescrObject *)cur)->d_method == &def_uv_call_soon;
    Py_XDECREF(cur);
    PyErr_Clear();
    if (ours && PyObject_DelAttrString(H.uv_loop_cls, "call_soon") < 0)
        PyErr_Clear();
    /* uv_loop_cls and orig_uv_call_soon stay referenced: a kept hook still works. */
}

/* ------------------------------------------------------------------ install */

static PyMethodDef def_run = {"_run", hook_run, METH_NOARGS, "aioprof hook around Handle._run."};
static PyMethodDef def_call_soon = {"_call_soon", (PyCFunction)(void (*)(void))hook_call_soon,
                                    METH_FASTCALL | METH_KEYWORDS, "aioprof hook around _call_soon."};
static PyMethodDef def_run_once = {"_run_once", hook_run_once, METH_NOARGS,
                                   "aioprof hook around BaseEventLoop._run_once."};
static PyMethodDef def_run_forever = {"run_forever", hook_run_forever, METH_NOARGS,
                                      "aioprof hook around BaseEventLoop.run_forever."};
static PyMethodDef def_select = {"select", (PyCFunction)(void (*)(void))hook_select,
                                 METH_METHOD | METH_FASTCALL | METH_KEYWORDS,
                                 "aioprof hook around selector.select."};

/* Replace cls.name by a descriptor for def; saves the original in *orig.
 *
 * The originals are kept after uninstall, for the life of the process: a bound hook
 * someone kept (a cached method, another tool's wrapper made while profiling) may be
 * called after stop() and must still reach the original. */
static int swap(PyObject *cls, const char *name, PyMethodDef *def, PyObject **orig)
{
    PyObject *cur = own_attr(cls, name);
    if (!cur)
        return -1;
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)cls, def);
    if (!descr) {
        Py_DECREF(cur);
        return -1;
    }
    int rc = PyObject_SetAttrString(cls, name, descr);
    Py_DECREF(descr);
    if (rc < 0) {
        Py_DECREF(cur);
        return -1;
    }
    Py_XSETREF(*orig, cur);
    return 0;
}

/* Put the original back, but only where our hook is still in place: a wrapper that the
 * program (or another tool) put over it while profiling stays, as it would without us,
 * and calls through our hook to the original. */
static void restore(PyObject *cls, const char *name, PyObject *orig)
{
    if (!cls || !orig)
        return;
    PyObject *cur = own_attr(cls, name);
    int ours = cur && Py_IS_TYPE(cur, &PyMethodDescr_Type) &&
               ((PyMethodDescrObject *)cur)->d_method->ml_meth != NULL &&
               ((PyMethodDescrObject *)cur)->d_common.d_type == (PyTypeObject *)cls &&
               PyUnicode_CompareWithASCIIString(((PyMethodDescrObject *)cur)->d_common.d_name, name) == 0 &&
               cur != orig && is_hook_def(((PyMethodDescrObject *)cur)->d_method);
    Py_XDECREF(cur);
    PyErr_Clear();
    if (ours && PyObject_SetAttrString(cls, name, orig) < 0)
        PyErr_Clear();
}

static PyObject *get_attr_path(const char *module, const char *attr)
{
    PyObject *m = PyImport_ImportModule(module);
    if (!m)
        return NULL;
    PyObject *a = PyObject_GetAttrString(m, attr);
    Py_DECREF(m);
    return a;
}

static void hooks_uninstall(void);

/* The class in cls's MRO that defines `name` itself (the program may have put a subclass
 * in asyncio.events.Handle); steals cls, returns a new reference or NULL. */
static PyObject *defining_class(PyObject *cls, const char *name)
{
    if (!cls || !PyType_Check(cls)) {
        if (cls)
            PyErr_Format(PyExc_TypeError, "aioprof: %R is not a class", cls);
        Py_XDECREF(cls);
        return NULL;
    }
    PyObject *mro = ((PyTypeObject *)cls)->tp_mro, *found = NULL;
    for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro) && !found; i++) {
        PyObject *base = PyTuple_GET_ITEM(mro, i), *attr = own_attr(base, name);
        if (attr) {
            Py_DECREF(attr);
            found = Py_NewRef(base);
        } else if (PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
        } else {
            break;
        }
    }
    if (!found && !PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "aioprof: %R has no %s method", cls, name);
    Py_DECREF(cls);
    return found;
}

/* Whether `fn` is the Python function `qualname` of asyncio's module `module` (not a
 * wrapper the program or another tool put in its place). Never raises. */
static int is_asyncio_function(PyObject *fn, const char *module, const char *qualname)
{
    if (!PyFunction_Check(fn))
        return 0;
    PyObject *mod = PyFunction_GetModule(fn);   /* borrowed */
    PyObject *qual = PyObject_GetAttrString(fn, "__qualname__");
    int ours = mod && PyUnicode_Check(mod) && PyUnicode_CompareWithASCIIString(mod, module) == 0 && qual &&
               PyUnicode_Check(qual) && PyUnicode_CompareWithASCIIString(qual, qualname) == 0;
    Py_XDECREF(qual);
    PyErr_Clear();
    return ours;
}

/* Whether the saved _call_soon is asyncio's own, whose work call_soon_fast does; not
 * when the program (or another tool) put its own _call_soon there before we started. */
static int fast_call_soon_init(void)
{
    H.fast_call_soon = 0;
    if (!str_Handle && (!(str_Handle = PyUnicode_InternFromString("Handle")) ||
                        !(str_ready = PyUnicode_InternFromString("_ready")) ||
                        !(str_append = PyUnicode_InternFromString("append"))))
        return -1;
    if (ap_slot_init(&slot_source_tb, H.handle_cls, "_source_traceback") < 0)
        return -1;
    if (!H.deque_type) {
        H.deque_type = get_attr_path("collections", "deque");
        H.deque_append = H.deque_type ? PyObject_GetAttrString(H.deque_type, "append") : NULL;
        if (!H.deque_append) {
            Py_CLEAR(H.deque_type);
            return -1;
        }
    }
    if (!is_asyncio_function(H.orig_call_soon, "asyncio.base_events", "BaseEventLoop._call_soon"))
        return 0;
    PyObject *events = PyDict_GetItemString(PyFunction_GetGlobals(H.orig_call_soon), "events");
    if (!events || !PyModule_Check(events))
        return 0;
    PyObject *dict = PyModule_GetDict(events);   /* borrowed */
    if (PyDict_GetItemString(dict, "Handle") != H.handle_cls)
        return 0;
    Py_INCREF(dict);
    Py_XSETREF(H.events_dict, dict);
    H.fast_call_soon = 1;
    return 0;
}

/* Whether the saved Handle._run is asyncio's own, whose try body run_handle does. */
static int fast_run_init(void)
{
    H.fast_run = 0;
    if (ap_slot_init(&slot_context, H.handle_cls, "_context") < 0 ||
        ap_slot_init(&slot_args, H.handle_cls, "_args") < 0)
        return -1;
    if (!H.replay_type && !(H.replay_type = (PyTypeObject *)PyType_FromSpec(&replay_spec)))
        return -1;
    H.fast_run = is_asyncio_function(H.orig_run, "asyncio.events", "Handle._run");
    return 0;
}

static int hooks_install(void)
{
    if (H.installed) {
        PyErr_SetString(PyExc_RuntimeError, "aioprof hooks are already installed");
        return -1;
    }
    if (!str_when) {
        str_when = PyUnicode_InternFromString("_when");
        str_timeout = PyUnicode_InternFromString("timeout");
        if (!str_when || !str_timeout)
            return -1;
    }
    Py_XSETREF(H.handle_cls, defining_class(get_attr_path("asyncio.events", "Handle"), "_run"));
    Py_XSETREF(H.loop_cls, get_attr_path("asyncio.base_events", "BaseEventLoop"));
    if (!H.handle_cls || !H.loop_cls || ap_slot_init(&slot_callback, H.handle_cls, "_callback") < 0)
        goto error;
    if (swap(H.handle_cls, "_run", &def_run, &H.orig_run) < 0 ||
        swap(H.loop_cls, "_call_soon", &def_call_soon, &H.orig_call_soon) < 0 ||
        swap(H.loop_cls, "_run_once", &def_run_once, &H.orig_run_once) < 0 ||
        swap(H.loop_cls, "run_forever", &def_run_forever, &H.orig_run_forever) < 0)
        goto error;
    for (int i = 0; i < N_SEL; i++) {
        PyObject *cls = get_attr_path("selectors", sel_names[i]);
        if (!cls) {
            PyErr_Clear();   /* not on this platform */
            continue;
        }
        PyObject *dict = PyObject_GetAttrString(cls, "__dict__");
        int own = dict ? PyMapping_HasKeyString(dict, "select") : 0;
        Py_XDECREF(dict);
        if (!own) {
            Py_DECREF(cls);
            continue;
        }
        Py_XSETREF(H.sel_cls[i], cls);
        if (swap(cls, "select", &def_select, &H.orig_select[i]) < 0)
            goto error;
    }
    if (fast_call_soon_init() < 0 || fast_run_init() < 0)
        goto error;
    if (uv_install() < 0)
        goto error;
    H.installed = 1;
    return 0;
error:
    H.installed = 1;
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    hooks_uninstall();
    ap_exc_restore(&exc);
    return -1;
}

int ap_hooks_uvloop(void)
{
    return H.installed ? uv_install() : 0;
}

int ap_hooks_acquire(void)
{
    if (hooks_refs == 0 && hooks_install() < 0)
        return -1;
    hooks_refs++;
    return 0;
}

void ap_hooks_release(void)
{
    if (hooks_refs > 0 && --hooks_refs == 0)
        hooks_uninstall();
}

static int is_hook_def(const PyMethodDef *def)
{
    return def == &def_run || def == &def_call_soon || def == &def_run_once || def == &def_run_forever ||
           def == &def_select || def == &def_uv_call_soon;
}

static void hooks_uninstall(void)
{
    if (!H.installed)
        return;
    /* The classes and originals stay referenced (see swap): a kept hook still works. */
    restore(H.handle_cls, "_run", H.orig_run);
    restore(H.loop_cls, "_call_soon", H.orig_call_soon);
    restore(H.loop_cls, "_run_once", H.orig_run_once);
    restore(H.loop_cls, "run_forever", H.orig_run_forever);
    uv_uninstall();
    for (int i = 0; i < N_SEL; i++)
        restore(H.sel_cls[i], "select", H.orig_select[i]);
    H.installed = 0;
}
