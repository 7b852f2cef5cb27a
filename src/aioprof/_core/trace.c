/* trace.c - the trace: a bounded ring of timeline events (docs/stacks.md).
 *
 * Fixed size, allocated at start: a long run keeps its newest window, and recording
 * an event is a store into the ring, with no allocation on the hot path. */
#include "profile.h"

#include <string.h>

int ap_trace_init(ap_session_t *s, uint32_t capacity)
{
    if (!capacity)
        return 0;
    s->trace = PyMem_RawCalloc(capacity, sizeof(ap_trace_ev_t));
    if (!s->trace) {
        PyErr_NoMemory();
        return -1;
    }
    s->trace_cap = capacity;
    return 0;
}

void ap_trace_add(ap_session_t *s, int kind, uint64_t a, uint64_t b, ap_ns_t t0, ap_ns_t t1, uint32_t n)
{
    ap_trace_ev_t *e = &s->trace[s->trace_next % s->trace_cap];
    e->kind = (uint8_t)kind;
    e->n = n;
    e->a = a;
    e->b = b;
    e->t0 = t0;
    e->t1 = t1;
    s->trace_next++;
}

static PyObject *secs(ap_session_t *s, ap_ns_t t)
{
    return PyLong_FromLongLong(t - s->t0);
}

static PyObject *site_or_none(ap_session_t *s, uint32_t site)
{
    if (site == AP_NONE)
        return Py_NewRef(Py_None);
    ap_code_t *c = &s->codes[s->sites[site].code];
    return Py_BuildValue("{s:O,s:i,s:O}", "file", c->filename, "line", s->sites[site].line, "function", c->qualname);
}

static PyObject *event_obj(ap_session_t *s, const ap_trace_ev_t *e)
{
    switch (e->kind) {
    case AP_EV_RUN:
        return Py_BuildValue("{s:s,s:N,s:N,s:K,s:k,s:N,s:N}", "kind", "run",
                             "task", e->a ? PyLong_FromUnsignedLongLong(e->a) : Py_NewRef(Py_None),
                             "callback", e->a ? Py_NewRef(Py_None) : (e->n != AP_NONE ? Py_NewRef(s->cbs[e->n].name) : Py_NewRef(Py_None)),
                             "loop", (unsigned long long)(e->b & 0xffffffffu), "thread", (unsigned long)s->trace_threads[e->b >> 32],
                             "start_ns", secs(s, e->t0), "end_ns", secs(s, e->t1));
    case AP_EV_SCHEDULED:
        return Py_BuildValue("{s:s,s:K,s:N,s:N}", "kind", "scheduled", "task", (unsigned long long)e->a,
                             "start_ns", secs(s, e->t0), "end_ns", secs(s, e->t1));
    case AP_EV_AWAIT:
        return Py_BuildValue("{s:s,s:K,s:N,s:N,s:N}", "kind", "await", "task", (unsigned long long)e->a,
                             "start_ns", secs(s, e->t0), "end_ns", secs(s, e->t1), "site", site_or_none(s, e->n));
    case AP_EV_TICK:
    case AP_EV_SELECT:
        return Py_BuildValue("{s:s,s:K,s:k,s:N,s:N,s:I}", "kind", e->kind == AP_EV_TICK ? "tick" : "select",
                             "loop", (unsigned long long)(e->b & 0xffffffffu), "thread",
                             (unsigned long)s->trace_threads[e->b >> 32], "start_ns", secs(s, e->t0),
                             "end_ns", secs(s, e->t1), e->kind == AP_EV_TICK ? "handles" : "events", e->n);
    default:
        return Py_BuildValue("{s:s,s:K,s:N,s:N}", "kind", "create", "task", (unsigned long long)e->a,
                             "parent", e->b ? PyLong_FromUnsignedLongLong(e->b) : Py_NewRef(Py_None),
                             "at_ns", secs(s, e->t0));
    }
}

int ap_trace_snapshot(ap_session_t *s, PyObject *doc)
{
    if (!s->trace_cap)
        return 0;
    uint64_t count = s->trace_next < s->trace_cap ? s->trace_next : s->trace_cap;
    uint64_t first = s->trace_next - count;
    PyObject *events = PyList_New(0);
    for (uint64_t i = 0; events && i < count; i++) {
        PyObject *o = event_obj(s, &s->trace[(first + i) % s->trace_cap]);
        if (!o || PyList_Append(events, o) < 0)
            Py_CLEAR(events);
        Py_XDECREF(o);
    }
    if (!events)
        return -1;
    PyObject *tr = Py_BuildValue("{s:I,s:K,s:N}", "capacity", s->trace_cap, "dropped",
                                 (unsigned long long)(s->trace_next - count), "events", events);
    int rc = tr ? PyDict_SetItemString(doc, "trace", tr) : -1;
    Py_XDECREF(tr);
    return rc;
}

/* Loop and thread of an event packed in one word: loop id low, thread slot high. */
uint64_t ap_trace_where(ap_session_t *s, ap_loop_t *l, unsigned long thread)
{
    uint32_t slot = 0;
    while (slot < s->n_trace_threads && s->trace_threads[slot] != thread)
        slot++;
    if (slot == s->n_trace_threads) {
        if (slot == AP_TRACE_THREADS)
            slot = AP_TRACE_THREADS - 1;   /* more threads than slots: share the last */
        else
            s->trace_threads[s->n_trace_threads++] = thread;
    }
    return ((uint64_t)slot << 32) | (l ? (uint32_t)l->id : 0);
}
