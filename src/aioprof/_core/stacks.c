/* stacks.c - async call stacks, the sampler, the await flame and blocking stacks.
 *
 * A stack is an interned sequence of frame indices, root first; a frame is a code
 * line, a task marker, a callback marker or the [asyncio] marker (docs/stacks.md).
 *
 * The sampler (below) is a C thread; the main thread's loop is sampled by the main
 * thread itself at the sampler's request, other threads' by the sampler under the GIL. */
#define _GNU_SOURCE 1   /* pthread_timedjoin_np */
#include "profile.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#define MAX_STACK 128
#define MAX_AWAITERS 8
#define WATCH_SLOTS 64   /* threads whose step starts the watchdog reads without the GIL */

enum { FR_CODE, FR_TASK, FR_CALLBACK, FR_ASYNCIO };

/* ------------------------------------------------------------------ interning */

static uint32_t frame_get(ap_session_t *s, int kind, uint32_t ref)
{
    uintptr_t key = ap_mix2((uintptr_t)kind + 0x51, ref);
    uintptr_t v = ap_table_get(&s->frame_idx, key);
    if (v && s->frames[v - 1].kind == kind && s->frames[v - 1].ref == ref)
        return (uint32_t)(v - 1);
    if (ap_grow((void **)&s->frames, &s->cap_frames, sizeof(ap_frame_t), s->n_frames) < 0 ||
        ap_table_put(&s->frame_idx, key, s->n_frames + 1) < 0) {
        PyErr_NoMemory();
        return AP_NONE;
    }
    s->frames[s->n_frames] = (ap_frame_t){(uint8_t)kind, ref};
    return s->n_frames++;
}

static uint32_t stack_get(ap_session_t *s, const uint32_t *fr, uint32_t n)
{
    uintptr_t key = ap_seq_hash(fr, n, 0x57ac);
    uintptr_t v = ap_table_get(&s->stack_idx, key);
    if (v) {
        ap_stack_t *st = &s->stacks[v - 1];
        return (st->n == n && memcmp(st->frames, fr, n * sizeof *fr) == 0) ? (uint32_t)(v - 1) : AP_NONE;
    }
    uint32_t *copy = PyMem_RawMalloc(n * sizeof *fr + 1);
    if (!copy || ap_grow((void **)&s->stacks, &s->cap_stacks, sizeof(ap_stack_t), s->n_stacks) < 0 ||
        ap_table_put(&s->stack_idx, key, s->n_stacks + 1) < 0) {
        PyMem_RawFree(copy);
        PyErr_NoMemory();
        return AP_NONE;
    }
    memcpy(copy, fr, n * sizeof *fr);
    memset(&s->stacks[s->n_stacks], 0, sizeof(ap_stack_t));
    s->stacks[s->n_stacks].n = n;
    s->stacks[s->n_stacks].frames = copy;
    return s->n_stacks++;
}

/* ------------------------------------------------------------------ awaiting tasks */

static int is_future(PyObject *obj)
{
    /* asyncio futures (C or Python) all have _callbacks; that is what we read. */
    return obj && !PyType_Check(obj) && PyObject_HasAttrString(obj, "_asyncio_future_blocking");
}

/* The task that awaits `fut` (new reference), directly or through gather, shield,
 * wait_for or a TaskGroup, found through fut's done callbacks; NULL if none. */
static PyObject *awaiter_of(ap_session_t *s, PyObject *fut, int depth)
{
    if (depth > 4)
        return NULL;
    PyObject *cbs = PyObject_GetAttrString(fut, "_callbacks");
    if (!cbs || !PyList_Check(cbs)) {
        Py_XDECREF(cbs);
        PyErr_Clear();
        return NULL;
    }
    PyObject *found = NULL;
    for (Py_ssize_t i = 0; !found && i < PyList_GET_SIZE(cbs); i++) {
        PyObject *cb = PyList_GET_ITEM(cbs, i);
        if (PyTuple_Check(cb) && PyTuple_GET_SIZE(cb) > 0)
            cb = PyTuple_GET_ITEM(cb, 0);
        PyObject *task = ap_task_of_callback(s, cb);
        if (task) {
            found = Py_NewRef(task);   /* a task awaiting fut itself */
            break;
        }
        if (PyMethod_Check(cb)) {
            /* TaskGroup._on_task_done: the group's parent task waits for its children. */
            PyObject *parent = PyObject_GetAttrString(PyMethod_GET_SELF(cb), "_parent_task");
            if (parent && parent != Py_None)
                found = parent;
            else
                Py_XDECREF(parent);
            PyErr_Clear();
        } else if (strcmp(Py_TYPE(cb)->tp_name, "functools.partial") == 0) {
            /* wait_for (3.10-3.11): partial(_release_waiter, waiter), and the task of
             * wait_for awaits the waiter future. */
            PyObject *args = PyObject_GetAttrString(cb, "args");
            for (Py_ssize_t j = 0; args && PyTuple_Check(args) && !found && j < PyTuple_GET_SIZE(args); j++) {
                PyObject *v = PyTuple_GET_ITEM(args, j);
                if (v != fut && is_future(v))
                    found = awaiter_of(s, v, depth + 1);
            }
            Py_XDECREF(args);
            PyErr_Clear();
        } else if (PyFunction_Check(cb)) {
            /* gather's and shield's callbacks close over the outer future. */
            PyObject *closure = PyFunction_GetClosure(cb);
            for (Py_ssize_t j = 0; closure && !found && j < PyTuple_GET_SIZE(closure); j++) {
                PyObject *v = PyCell_GET(PyTuple_GET_ITEM(closure, j));
                if (v && v != fut && is_future(v))
                    found = awaiter_of(s, v, depth + 1);
            }
        }
    }
    Py_DECREF(cbs);
    PyErr_Clear();
    return found;
}

/* Append a task's marker and its await chain (as code frames) to out. */
static int push_task(ap_session_t *s, PyObject *task, uint32_t *out, int n)
{
    PyObject *coro = PyObject_CallMethod(task, "get_coro", NULL);
    if (!coro) {
        PyErr_Clear();
        return n;
    }
    uint32_t ref = AP_NONE;
    if (coro != Py_None) {
        PyObject *code = PyObject_GetAttrString(coro, PyGen_Check(coro) ? "gi_code" : "cr_code");
        if (code && PyCode_Check(code))
            ref = ap_code_get(s, code);
        Py_XDECREF(code);
        PyErr_Clear();
    }
    uint32_t marker = frame_get(s, FR_TASK, ref);
    if (marker != AP_NONE && n < MAX_STACK)
        out[n++] = marker;
    uint32_t chain = coro != Py_None ? ap_chain_of(s, coro) : AP_NONE;
    PyErr_Clear();
    if (chain != AP_NONE) {
        ap_chain_t *c = &s->chains[chain];
        for (uint32_t i = 0; i < c->n && n < MAX_STACK; i++) {
            uint32_t f = frame_get(s, FR_CODE, c->sites[i]);
            if (f != AP_NONE)
                out[n++] = f;
        }
    }
    Py_DECREF(coro);
    return n;
}

/* The prefix of tasks awaiting `task`, outermost first. */
static int push_awaiters(ap_session_t *s, PyObject *task, uint32_t *out, int n)
{
    PyObject *chain[MAX_AWAITERS];
    int k = 0;
    PyObject *cur = awaiter_of(s, task, 0);
    while (cur && k < MAX_AWAITERS) {
        int seen = cur == task;
        for (int i = 0; i < k && !seen; i++)
            seen = chain[i] == cur;
        if (seen) {   /* a cycle cannot happen in a running program, but never loop */
            Py_DECREF(cur);
            break;
        }
        chain[k++] = cur;
        cur = awaiter_of(s, cur, 0);
    }
    if (k == MAX_AWAITERS)
        Py_XDECREF(cur);
    for (int i = k - 1; i >= 0; i--) {
        n = push_task(s, chain[i], out, n);
        Py_DECREF(chain[i]);
    }
    return n;
}

/* ------------------------------------------------------------------ await flame */

void ap_stack_charge_idle(ap_session_t *s, PyObject *task, ap_task_t *t, uint32_t chain, ap_ns_t idle)
{
    uint32_t fr[MAX_STACK];
    int n = push_awaiters(s, task, fr, 0);
    uint32_t ref = t->coro_idx != AP_NONE ? s->coros[t->coro_idx].code : AP_NONE;
    uint32_t marker = frame_get(s, FR_TASK, ref);
    if (marker != AP_NONE && n < MAX_STACK)
        fr[n++] = marker;
    ap_chain_t *c = &s->chains[chain];
    for (uint32_t i = 0; i < c->n && n < MAX_STACK; i++) {
        uint32_t f = frame_get(s, FR_CODE, c->sites[i]);
        if (f != AP_NONE)
            fr[n++] = f;
    }
    uint32_t st = stack_get(s, fr, (uint32_t)n);
    if (st != AP_NONE) {
        s->stacks[st].idle_count++;
        s->stacks[st].idle_ns += idle;
    }
    PyErr_Clear();
}

/* ------------------------------------------------------------------ running stacks */

/* The async call stack of the handle thread `th` runs now, from its innermost frame
 * `f` (a new reference, consumed). AP_NONE if nothing to charge. */
static uint32_t running_stack(ap_session_t *s, ap_thread_t *th, PyFrameObject *f)
{
    uint32_t leaf[MAX_STACK];
    int nleaf = 0;
    while (f && nleaf < MAX_STACK) {
        PyCodeObject *code = PyFrame_GetCode(f);
        uint32_t c = ap_code_get(s, (PyObject *)code);
        if (c == AP_NONE || s->codes[c].is_loop_entry) {
            Py_DECREF(code);
            break;
        }
        uint32_t fr;
        if (s->codes[c].is_asyncio || s->codes[c].is_aioprof)
            fr = frame_get(s, FR_ASYNCIO, 0);
        else
            fr = frame_get(s, FR_CODE, ap_site_get(s, (PyObject *)code, ap_frame_line(s, f, (PyObject *)code)));
        Py_DECREF(code);
        /* one [asyncio] marker per run of asyncio frames */
        if (fr != AP_NONE && !(nleaf && leaf[nleaf - 1] == fr && s->frames[fr].kind == FR_ASYNCIO))
            leaf[nleaf++] = fr;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    uint32_t out[MAX_STACK];
    int n = 0;
    if (th->task) {
        /* The tasks awaiting this one do not change while it runs: walk them once per
         * step (the walk reads futures' callbacks and coroutines, the dear part). */
        if (th->prefix_step != th->step_serial) {
            PyObject *task = th->task->wr ? ap_weakref_get(th->task->wr) : NULL;
            uint32_t pre[MAX_STACK];
            int k = task ? push_awaiters(s, task, pre, 0) : 0;
            Py_XDECREF(task);
            th->n_prefix = (uint32_t)(k < 64 ? k : 64);
            memcpy(th->prefix, pre, th->n_prefix * sizeof *pre);
            th->prefix_step = th->step_serial;
        }
        memcpy(out, th->prefix, th->n_prefix * sizeof *out);
        n = (int)th->n_prefix;
        uint32_t ref = th->task->coro_idx != AP_NONE ? s->coros[th->task->coro_idx].code : AP_NONE;
        uint32_t m = frame_get(s, FR_TASK, ref);
        if (m != AP_NONE && n < MAX_STACK)
            out[n++] = m;
    } else if (th->cb != AP_NONE) {
        uint32_t m = frame_get(s, FR_CALLBACK, th->cb);
        if (m != AP_NONE && n < MAX_STACK)
            out[n++] = m;
    }
    /* Too deep: keep the innermost frames (where the time is), drop outer ones. */
    int keep = nleaf < MAX_STACK - n ? nleaf : MAX_STACK - n;
    for (int i = keep - 1; i >= 0; i--)
        out[n++] = leaf[i];   // cppcheck-suppress uninitvar ; keep <= nleaf, all set
    PyErr_Clear();
    return n ? stack_get(s, out, (uint32_t)n) : AP_NONE;
}

/* ------------------------------------------------------------------ the sampler */

/* The sampler is a C thread that sleeps one interval at a time and never holds the GIL
 * while it waits. How a sample is taken depends on the thread whose loop is inside a
 * handle:
 *
 *  - The main thread is sampled by itself (AP_SAMPLE_LOOP), at the next point where
 *    the interpreter checks for pending work: within microseconds in Python code.
 *      3.13+: the sampler thread calls Py_AddPendingCall; the main thread runs the
 *             callback. 3.10-3.12 compute the "eval breaker" in the calling thread, so
 *             a pending call from another thread waits for the next GIL switch.
 *      3.10-3.12: when the main thread is running (its CPU clock advances) and has
 *             not served the pending call, the sampler sends it a real-time signal whose
 *             Python-level handler is a C function (_core._sample_signal); Python's
 *             own signal machinery calls it from the main thread. Installed with
 *             SA_RESTART, so restartable system calls of foreign C code do not see
 *             EINTR; Python retries the rest itself (PEP 475).
 *  - Other threads (AP_SAMPLE_GIL) are sampled from the sampler thread, which takes
 *    the GIL; the running thread hands it over at its next switch point (at most
 *    sys.getswitchinterval() later, sooner when it blocks in C).
 *
 * A sample is weighted by the thread's handle time since its previous sample, so late
 * or coarse samples still sum to the time spent; a thread in select is never inside a
 * handle, so select is never charged. At most one loop-thread request is outstanding. */
static struct {
    pthread_t thread;
    atomic_int busy;           /* GIL-sampled threads inside a handle */
    atomic_int main_busy;      /* the main thread is inside a handle */
    atomic_int outstanding;    /* a main-thread sample was requested, not yet taken */
    atomic_int queued;         /* our pending call is in the interpreter's queue */
    atomic_ullong gen;         /* the running sampler's generation; bumped at stop */
    struct timespec interval;
    atomic_int signum;         /* 3.10-3.12: the signal, 0 if none could be had or held */
    clockid_t main_cpu;        /* the main thread's CPU-time clock (3.10-3.12) */
    int has_main_cpu;
    ap_ns_t probe_wall, probe_cpu; /* sampler thread only: when main_running last looked */
    atomic_int handled;        /* the last signal sent reached the trampoline */
    int masked;                /* the signal, while the main thread blocks it, or 0 */
    atomic_int step_signals;   /* signals sent during the main thread's current step */
    unsigned skipped;          /* sampler thread only: intervals since the last signal */
    pthread_mutex_t send_lock; /* a request is sent only by a sampler still current */
    /* The watchdog (sampling off, slow_ns > 0): the step start of each thread inside a
     * handle, 0 when none or already captured; read by the sampler thread without the GIL. */
    int watch;
    ap_ns_t slow_ns;
    atomic_llong starts[WATCH_SLOTS];
    atomic_int n_slots;
    atomic_int unslotted;      /* a thread had no slot: look every slow_ns / 4 while busy */
    pthread_mutex_t watch_lock;  /* the watchdog sleeps on watch_cond: woken to leave at fork */
    pthread_cond_t watch_cond;
    int watch_cond_ready, watch_joinable;
    atomic_int watch_restart;  /* stopped for a fork: the next step starts it again */
    atomic_int watch_wants_gil;   /* the watchdog is taking (or holds) the GIL */
    /* 3.10-3.12: the program took the signal over; the main thread looks for another */
    atomic_int lost;
    int warned;                /* the warning that no signal is left was given */
    uint64_t taken;            /* signals the program took over this session (bit sig - SIGRTMIN) */
    PyObject *handler;         /* _core._sample_signal (strong) */
} S = {.send_lock = PTHREAD_MUTEX_INITIALIZER, .watch_lock = PTHREAD_MUTEX_INITIALIZER, .handled = 1};

/* One sample of `th`, inside a handle, whose innermost frame is `frame` (a new
 * reference, consumed). */
static void sample_thread(ap_session_t *s, ap_thread_t *th, ap_ns_t now, PyFrameObject *frame)
{
    ap_ns_t in_step = now - th->step_start;
    int capture = s->slow_ns > 0 && in_step >= s->slow_ns && th->blocked_step != th->step_serial;
    if (!s->sample_interval && !capture) {   /* the watchdog alone: nothing to do yet */
        Py_XDECREF(frame);
        return;
    }
    /* The time since the previous sample is shared by what the two samples saw. Inside
     * one step: half to each (a line change falls anywhere between them, so neither the
     * earlier nor the later line is favoured); the step's time after its last sample goes
     * to that sample at the step's end (ap_sampler_step). The first sample of a step has
     * the step's time so far, and of the handles before it (which no sample saw) at most
     * one interval: the rest, such as the time of a long unsampled step, is counted as
     * uncharged, never given to the code that happens to run next. */
    ap_ns_t busy = th->handle_ns + in_step;
    ap_ns_t weight = busy - th->sampled_ns;
    th->sampled_ns = busy;
    uint32_t st = running_stack(s, th, frame);
    if (st == AP_NONE)
        return;
    if (s->sample_interval) {
        if (th->last_stack1 && th->last_stack_step == th->step_serial && th->last_stack1 <= s->n_stacks) {
            s->stacks[th->last_stack1 - 1].sample_ns += weight / 2;
            weight -= weight / 2;
        } else {
            ap_ns_t cap = in_step > s->sample_interval ? in_step : s->sample_interval;
            if (weight > cap) {
                s->uncharged_ns += weight - cap;
                weight = cap;
            }
        }
        s->stacks[st].samples++;
        s->stacks[st].sample_ns += weight;
        s->n_samples++;
        th->last_stack1 = st + 1;
        th->last_stack_step = th->step_serial;
    }
    if (capture) {
        th->blocked_step = th->step_serial;   /* one capture per slow step, while it runs */
        s->stacks[st].blocking++;
        th->block_site1 = 0;
        ap_stack_t *k = &s->stacks[st];
        for (uint32_t i = k->n; i-- > 0 && !th->block_site1;) {
            const ap_frame_t *f = &s->frames[k->frames[i]];
            if (f->kind == FR_CODE)
                th->block_site1 = f->ref + 1;   /* the innermost line: where it blocks */
        }
    }
}

uint32_t ap_sampler_blocked_at(const ap_thread_t *th)
{
    return th->sampled && th->blocked_step == th->step_serial ? th->block_site1 : 0;
}

/* The GIL-sampled threads inside a handle (sampler thread, GIL held). */
static void sample_threads(ap_session_t *s)
{
    ap_ns_t now = ap_clock_wall();
    for (ap_thread_t *th = s->threads; th; th = th->next) {
        /* Read with the GIL held: a thread inside a handle is alive, its tstate valid. */
        if (th->sampled == AP_SAMPLE_GIL && th->depth > 0 && th->tstate && th->step_start != 0)
            sample_thread(s, th, now, PyThreadState_GetFrame(th->tstate));
        /* The watchdog looks at a step once past slow_ns: captured now, or never. */
        if (S.watch && th->watch_slot > 0 && th->step_start != 0 && now - th->step_start >= s->slow_ns)
            atomic_store(&S.starts[th->watch_slot - 1], 0);
    }
}

static void signal_fallback(int lost);

/* A main-thread sample, in the main thread with the GIL held; `frame` is borrowed or
 * NULL (then the current frame). Never raises. */
static void sample_main(unsigned long long gen, PyFrameObject *frame)
{
    if (!atomic_exchange(&S.outstanding, 0))
        return;   /* the request was served already (by the pending call or the signal) */
    ap_session_t *s = ap_session;
    if (atomic_load(&S.gen) != gen || !s || s->disabled)
        return;
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    int lost = atomic_exchange(&S.lost, 0);
    if (lost)
        signal_fallback(lost);   /* taken over from C (sigaction): another one, or a warning */
    ap_thread_t *th = ap_thread_get(s);
    if (th && th->sampled == AP_SAMPLE_LOOP && th->depth > 0 && th->step_start != 0) {
        if (!frame)
            frame = ap_current_frame();
        Py_XINCREF(frame);   /* consumed by sample_thread */
        sample_thread(s, th, ap_clock_wall(), frame);
    }
    if (PyErr_Occurred())
        ap_fault(s, "taking a sample");
    ap_exc_restore(&exc);
}

static int sample_pending(void *arg)
{
    atomic_store(&S.queued, 0);
    sample_main((unsigned long long)(uintptr_t)arg, NULL);
    return 0;
}

/* _core._sample_signal(signum, frame): the Python-level handler of the sampling signal
 * (3.10-3.12). Called by the interpreter in the main thread. */
PyObject *ap_sample_signal(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *frame = nargs >= 2 ? args[1] : NULL;
    sample_main(atomic_load(&S.gen), frame && PyFrame_Check(frame) ? (PyFrameObject *)frame : NULL);
    Py_RETURN_NONE;
}

#define SIGNAL_AFTER_NS 100000   /* a pending call not served by then gets the signal */

#if PY_VERSION_HEX < 0x030D0000
static PyOS_sighandler_t py_c_handler;   /* Python's C-level signal handler */

/* The C-level handler of the sampling signal: Python's own, called through this
 * function so that the sampler can tell, with sigaction() and without the GIL, whether
 * the program has since set the signal to something else (signal.signal() puts
 * Python's handler back in place of this one). */
static void sampling_trampoline(int sig)
{
    atomic_store(&S.handled, 1);
    if (py_c_handler)
        py_c_handler(sig);
}

/* Whether `sig` still goes to aioprof (any thread, no GIL: sigaction is async-signal-safe). */
static int signal_still_ours(int sig)
{
    struct sigaction cur;
    return sig > 0 && sigaction(sig, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
           cur.sa_handler == sampling_trampoline;
}
#else
static int signal_still_ours(int Py_UNUSED(sig)) { return 0; }   /* no signal on 3.13+ */
#endif

/* The main thread's CPU time, or -1. */
static ap_ns_t main_cpu_now(void)
{
    struct timespec ts;
    if (!S.has_main_cpu || clock_gettime(S.main_cpu, &ts) != 0)
        return -1;
    return (ap_ns_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Start watching whether the main thread runs (sampler thread). */
static void main_probe(void)
{
    S.probe_wall = ap_clock_wall();
    S.probe_cpu = main_cpu_now();
}

/* Whether the main thread ran on a CPU for at least a quarter of the time since the
 * last probe (sampler thread): Python code that holds the GIL needs the signal; a
 * thread blocked in a system call (time.sleep, signal.pause, a read) does not, and must
 * not get it: signal.pause() returns after any handled signal, and C code that does not
 * retry sees EINTR. A blocked step's pending call is served when the call returns (the
 * main thread re-takes the GIL and then looks for pending calls), with the weight of
 * the whole wait. Unknown CPU time counts as running. */
static int main_running(void)
{
    ap_ns_t wall0 = S.probe_wall, cpu0 = S.probe_cpu;
    main_probe();
    if (cpu0 < 0 || S.probe_cpu < 0)
        return 1;
    return (S.probe_cpu - cpu0) * 4 >= S.probe_wall - wall0;
}

/* Whether a signal may go now (sampler thread). Python writes each signal's number to
 * the signal wakeup fd, if one is set (asyncio's self-pipe after loop.add_signal_handler,
 * which aiohttp's run_app uses), and the loop drains it only between ticks: a long
 * pure-Python step signalled every millisecond fills it (about 230 one-byte writes on an
 * AF_UNIX socket), and Python then prints a warning on stderr for every signal. So the
 * signals of one step thin out: every interval for the first 16, then every 2nd for 16,
 * every 4th, ... (at 1 ms a 1 s step gets about 100, a 100 s step about 200). Samples
 * stay weighted by the time since the previous one, so they still sum to the step. */
static int signal_due(void)
{
    int level = atomic_load_explicit(&S.step_signals, memory_order_relaxed) / 16;
    unsigned every = 1u << (level < 16 ? level : 16);
    return ++S.skipped % every == 0;
}

/* Ask the main thread for a sample (sampler thread, no GIL): a pending call first. On
 * 3.10-3.12 the main thread notices it at its next GIL switch, which an I/O-bound loop
 * makes at every select and socket call; if it is still not served SIGNAL_AFTER_NS
 * later (Python code holding the GIL), or at the next interval (the request was made
 * between two handles), the signal follows. A signal costs the loop
 * thread more than a pending call (an interrupt, a signal frame, the handler's call). */
static void request_main(unsigned long long gen)
{
    pthread_mutex_lock(&S.send_lock);
    int sent = 0, stale = 0;
    if (atomic_load(&S.gen) == gen && !atomic_load(&S.outstanding)) {
        atomic_store(&S.outstanding, 1);
        sent = 1;
        /* One call queued at a time: while the main thread is blocked in C code, its
         * call waits in the queue (which holds 32) and the signals take the samples. */
        if (!atomic_load(&S.queued)) {
            atomic_store(&S.queued, 1);
            if (Py_AddPendingCall(sample_pending, (void *)(uintptr_t)gen) != 0) {
                atomic_store(&S.queued, 0);
                atomic_store(&S.outstanding, 0);   /* the queue is full: next interval */
                sent = 0;
            }
        }
    } else if (atomic_load(&S.gen) == gen) {
        stale = 1;   /* not served for a whole interval: the signal, now */
    }
    pthread_mutex_unlock(&S.send_lock);
    if (!atomic_load(&S.signum) || (!sent && !stale))
        return;
    if (sent) {
        main_probe();
        struct timespec ts = {0, SIGNAL_AFTER_NS};
        nanosleep(&ts, NULL);
    }
    if (!main_running())
        return;   /* blocked: its pending call is served when the call returns */
    pthread_mutex_lock(&S.send_lock);
    if (atomic_load(&S.gen) == gen && atomic_load(&S.outstanding) && atomic_load(&S.main_busy) > 0) {
        /* Never a signal the program has taken over (its handler would run, or the
         * default action end the process): from then on, pending calls only. */
        int sig = atomic_load(&S.signum);
        if (!sig || !signal_still_ours(sig)) {
            atomic_store(&S.signum, 0);
            if (sig)
                atomic_store(&S.lost, sig);   /* the main thread looks for another */
        }
        else if (signal_due() && atomic_exchange(&S.handled, 0)) {
            /* Never a second one while the last is pending (blocked in C code, which
             * the guard on pthread_sigmask does not see): real-time signals queue. */
            pthread_kill((pthread_t)ap_sampling.main_ident, sig);
            atomic_fetch_add_explicit(&S.step_signals, 1, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&S.send_lock);
}

/* Sleep one interval in slices of at most 20 ms, so a stopped sampler leaves soon.
 * Returns whether this sampler (generation `gen`) should go on. */
static int sleep_ns(unsigned long long gen, long long left)
{
    const long long slice = 20000000;
    while (left > 0 && atomic_load(&S.gen) == gen) {
        long long d = left < slice ? left : slice;
        struct timespec ts = {(time_t)(d / 1000000000), (long)(d % 1000000000)};
        nanosleep(&ts, NULL);
        left -= d;
    }
    return atomic_load(&S.gen) == gen;
}

static int sampler_sleep(unsigned long long gen)
{
    return sleep_ns(gen, (long long)S.interval.tv_sec * 1000000000 + S.interval.tv_nsec);
}

/* The watchdog (sampling off, slow_ns > 0): the same thread, sampling nothing. It reads
 * the step starts of the threads inside a handle (no GIL), sleeps until the earliest
 * would pass slow_ns, and only then takes the GIL and captures the stack of every step
 * past it (sample_threads; the main thread is GIL-sampled too: no signal, no pending
 * call). A step blocked in a system call has released the GIL and is captured at once;
 * one running Python code hands the GIL over at its next switch (at most
 * sys.getswitchinterval() later). Asleep while no step runs long. */
/* Take the GIL and sample (or capture) the GIL-sampled threads inside a handle, if this
 * sampler (generation `gen`) is still current (sampler thread). */
static void sample_threads_locked(unsigned long long gen, const char *what)
{
    atomic_store(&S.watch_wants_gil, 1);   /* (read by fork_prepare: do not wait for it) */
    PyGILState_STATE g = PyGILState_Ensure();
    ap_session_t *s = ap_session;
    if (atomic_load(&S.gen) == gen && s && !s->disabled) {
        ap_exc_state_t exc;
        ap_exc_save(&exc);
        sample_threads(s);
        if (PyErr_Occurred())
            ap_fault(s, what);
        ap_exc_restore(&exc);
    }
    PyGILState_Release(g);
    atomic_store(&S.watch_wants_gil, 0);
}

/* Sleep `ns` on the watchdog's condition variable (CLOCK_MONOTONIC): a fork wakes it to
 * leave. Returns whether this watchdog (generation `gen`) should go on. */
static int watch_sleep(unsigned long long gen, long long ns)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long long t = (long long)until.tv_nsec + ns;
    until.tv_sec += (time_t)(t / 1000000000);
    until.tv_nsec = (long)(t % 1000000000);
    pthread_mutex_lock(&S.watch_lock);
    while (atomic_load(&S.gen) == gen && pthread_cond_timedwait(&S.watch_cond, &S.watch_lock, &until) == 0) {
    }
    pthread_mutex_unlock(&S.watch_lock);
    return atomic_load(&S.gen) == gen;
}

static void *watchdog_main(void *arg)
{
    unsigned long long gen = (unsigned long long)(uintptr_t)arg;
    long long wait = 0;   /* look at once: after a fork, a step may be running already */
    while (watch_sleep(gen, wait)) {
        ap_ns_t now = ap_clock_wall(), first = 0;
        int n = atomic_load(&S.n_slots);
        for (int i = 0; i < n && i < WATCH_SLOTS; i++) {
            ap_ns_t t = atomic_load_explicit(&S.starts[i], memory_order_relaxed);
            if (t && (!first || t < first))
                first = t;
        }
        int unslotted = atomic_load(&S.unslotted) && atomic_load(&S.busy) > 0;
        wait = S.slow_ns;
        if (first && now - first < S.slow_ns)
            wait = S.slow_ns - (now - first) + 100000;   /* just past the threshold */
        if (unslotted && wait > S.slow_ns / 4)
            wait = S.slow_ns / 4 > 1000000 ? S.slow_ns / 4 : 1000000;
        if (!(first && now - first >= S.slow_ns) && !unslotted)
            continue;
        sample_threads_locked(gen, "capturing a blocking stack");
        if (wait <= 0)
            wait = 1000000;
    }
    return NULL;
}

/* The sampler thread is detached and never joined: it may wait a long time for the GIL
 * (busy loops in other threads can keep it from getting it), and stop() must not wait
 * with it. A stopped sampler sees its generation gone and leaves, touching nothing. */
static void *sampler_main(void *arg)
{
    unsigned long long gen = (unsigned long long)(uintptr_t)arg;
    while (sampler_sleep(gen)) {
        if (ap_sampling.main_mode && atomic_load_explicit(&S.main_busy, memory_order_relaxed) > 0)
            request_main(gen);
        if (atomic_load_explicit(&S.busy, memory_order_relaxed) == 0)
            continue;   /* every other loop is between handles or in select */
        sample_threads_locked(gen, "taking a sample");
    }
    return NULL;
}

/* The main thread's ident, or 0 (no exception) when it cannot be had. */
static unsigned long main_thread_ident(void)
{
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
    unsigned long r = ident && PyLong_Check(ident) ? PyLong_AsUnsignedLong(ident) : 0;
    Py_XDECREF(ident);
    Py_XDECREF(main);
    Py_XDECREF(threading);
    PyErr_Clear();
    return r == (unsigned long)-1 ? 0 : r;
}

#if PY_VERSION_HEX < 0x030D0000
/* 3.10-3.12: make `handler` the Python-level handler of a free real-time signal (one
 * whose handler is the default) and add SA_RESTART to the C-level handler Python
 * installed. Only from the main thread (signal.signal's rule). The handler stays
 * installed after stop, as a no-op: a signal still in flight must never meet the
 * default action (which ends the process). Returns the signal or 0. */
static int sampling_signal(PyObject *handler)
{
    static int installed;
    if (installed && signal_still_ours(installed))
        return installed;
    installed = 0;   /* none yet, or the program took ours over: find another free one */
    if (PyThread_get_thread_ident() != ap_sampling.main_ident)
        return 0;
    PyObject *mod = PyImport_ImportModule("signal");
    if (!mod) {
        PyErr_Clear();
        return 0;
    }
    int got = 0;
    for (int sig = SIGRTMAX - 2; sig >= SIGRTMAX - 6 && sig > SIGRTMIN && !got; sig--) {
        if (sig - SIGRTMIN < 64 && (S.taken >> (sig - SIGRTMIN)) & 1)
            continue;   /* the program took this one over from aioprof: it is the program's */
        PyObject *cur = PyObject_CallMethod(mod, "getsignal", "i", sig);
        PyObject *dfl = PyObject_GetAttrString(mod, "SIG_DFL");
        int free_sig = cur && dfl && cur == dfl;
        Py_XDECREF(cur);
        Py_XDECREF(dfl);
        PyObject *r = free_sig ? PyObject_CallMethod(mod, "signal", "iO", sig, handler) : NULL;
        if (r) {
            Py_DECREF(r);
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            py_c_handler = PyOS_getsig(sig);
            sa.sa_handler = sampling_trampoline;
            sa.sa_flags = SA_RESTART | SA_ONSTACK;
            sigemptyset(&sa.sa_mask);
            sigaction(sig, &sa, NULL);
            got = sig;
        }
        PyErr_Clear();
    }
    Py_DECREF(mod);
    return installed = got;
}

/* The guard on _signal.signal (3.10-3.12). The sampler checks that the signal is still
 * aioprof's before each pthread_kill, but the program can take it over between the
 * check and the kill, or while a signal sent just before waits to be delivered (the
 * main thread inside sigaction): the program's handler would get it, or SIG_DFL end
 * the process. So while the sampler signals, _signal.signal (which signal.signal calls)
 * is this guard: before the original changes aioprof's signal, the sampler stops
 * sending it, under the lock it sends with, and a signal sent before is delivered to
 * aioprof's handler at the return of a system call; the original's check of pending
 * signals then runs that handler. Sending resumes if the signal is still aioprof's
 * afterwards (the call failed). Not guarded: sigaction() called from C. */
static PyObject *guarded[2];       /* _signal.signal, _signal.pthread_sigmask as first found */

/* Main thread, GIL held. Whether `signum` is the signal the sampler sends: then it sends
 * no more, and any signal already sent has been handled by the trampoline. */
static int signal_hold(PyObject *signum)
{
    if (!ap_sampling.started || PyThread_get_thread_ident() != ap_sampling.main_ident || !PyLong_Check(signum))
        return 0;
    int overflow;
    long n = PyLong_AsLongAndOverflow(signum, &overflow);
    pthread_mutex_lock(&S.send_lock);
    int sig = atomic_load(&S.signum);
    if (sig && n == sig)
        atomic_store(&S.signum, 0);
    else
        sig = 0;
    pthread_mutex_unlock(&S.send_lock);
    if (sig) {
        /* The kernel delivers a signal already sent at the return of this system call;
         * one still pending is blocked in this thread: take it, or it would meet the new
         * disposition once unblocked. */
        sigset_t pending, one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        struct timespec zero = {0, 0};
        while (sigpending(&pending) == 0 && sigismember(&pending, sig) == 1 &&
               sigtimedwait(&one, NULL, &zero) == sig) {
        }
        atomic_store(&S.handled, 1);   /* none in flight now */
    }
    return sig;
}

/* Sending resumes if `sig` is still aioprof's; returns whether it is. */
static int signal_resume(int sig)
{
    pthread_mutex_lock(&S.send_lock);
    int ours = signal_still_ours(sig);
    if (ap_sampling.started && !atomic_load(&S.signum) && !S.masked && ours)
        atomic_store(&S.signum, sig);
    pthread_mutex_unlock(&S.send_lock);
    return ours;
}

/* The program took the signal `lost` over (main thread, GIL held): never take that one
 * again in this session; take another free one, or, when none is left, say once in the
 * report's warnings that pure-Python steps of the main thread go unsampled from now on. */
static void signal_fallback(int lost)
{
    if (lost >= SIGRTMIN && lost - SIGRTMIN < 64)
        S.taken |= 1ull << (lost - SIGRTMIN);
    ap_session_t *s = ap_session;
    if (!ap_sampling.started || ap_sampling.main_mode != AP_SAMPLE_LOOP || !S.handler || !s ||
        PyThread_get_thread_ident() != ap_sampling.main_ident)
        return;
    pthread_mutex_lock(&S.send_lock);
    int busy = atomic_load(&S.signum) || S.masked;
    pthread_mutex_unlock(&S.send_lock);
    if (busy)
        return;
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    int sig = sampling_signal(S.handler);
    sigset_t cur;
    if (sig && pthread_sigmask(SIG_BLOCK, NULL, &cur) == 0 && sigismember(&cur, sig) == 1)
        sig = 0;   /* blocked in the main thread: not usable now */
    pthread_mutex_lock(&S.send_lock);
    if (sig && ap_sampling.started && !atomic_load(&S.signum) && !S.masked) {
        atomic_store(&S.handled, 1);
        atomic_store(&S.signum, sig);
    }
    pthread_mutex_unlock(&S.send_lock);
    if (!sig && !S.warned) {
        S.warned = 1;
        PyObject *msg = PyUnicode_FromString(
            "the program took over the real-time signals aioprof can sample the main thread "
            "with (SIGRTMAX-2 ... SIGRTMAX-6): from then on, pure-Python steps of the main "
            "thread were sampled only where they released the GIL (docs/stacks.md)");
        if (!msg || PyList_Append(s->faults, msg) < 0)
            PyErr_Clear();
        Py_XDECREF(msg);
    }
    PyErr_Clear();
    ap_exc_restore(&exc);
}

/* The guard on _signal.pthread_sigmask (which signal.pthread_sigmask calls): a signal
 * blocked in the main thread would stay pending, show in the program's sigpending()
 * and sigwait(), and meet whatever disposition it has when unblocked. Before the call
 * the sampler stops sending, and a signal sent before is delivered while it still can
 * be; after it, sending resumes only if the main thread does not block the signal. */
static int mask_hold(void)
{
    if (!ap_sampling.started || PyThread_get_thread_ident() != ap_sampling.main_ident)
        return 0;
    pthread_mutex_lock(&S.send_lock);
    int sig = atomic_load(&S.signum);
    if (sig) {
        atomic_store(&S.signum, 0);
        S.masked = sig;
    }
    sig = S.masked;
    pthread_mutex_unlock(&S.send_lock);
    if (sig) {
        sigset_t pending;
        sigpending(&pending);   /* a signal already sent is delivered on its return */
    }
    return sig;
}

/* After a mask change (main thread): sending resumes unless the signal is blocked. */
static void mask_resume(int sig)
{
    sigset_t cur;
    if (pthread_sigmask(SIG_BLOCK, NULL, &cur) != 0 || sigismember(&cur, sig) == 1)
        return;   /* still blocked: paused until a change unblocks it */
    pthread_mutex_lock(&S.send_lock);
    S.masked = 0;
    pthread_mutex_unlock(&S.send_lock);
    signal_resume(sig);
}

static PyObject *signal_guard(PyObject *Py_UNUSED(self), PyObject *const *args, size_t nargsf,
                              PyObject *kwnames)
{
    int held = PyVectorcall_NARGS(nargsf) >= 1 ? signal_hold(args[0]) : 0;
    PyObject *r = PyObject_Vectorcall(guarded[0], args, nargsf, kwnames);
    if (r && ap_sampling.started && !held && PyVectorcall_NARGS(nargsf) >= 2 && args[1] != S.handler &&
        PyLong_Check(args[0])) {
        /* A real-time signal the program set itself is the program's: never taken later
         * in this session, even if it is left at the default. */
        int overflow;
        long n = PyLong_AsLongAndOverflow(args[0], &overflow);
        if (n >= SIGRTMIN && n <= SIGRTMAX && n - SIGRTMIN < 64 && !overflow && !PyErr_Occurred())
            S.taken |= 1ull << (n - SIGRTMIN);
        PyErr_Clear();
    }
    if (held && !signal_resume(held) && r)
        signal_fallback(held);   /* the program's now: another one, or a warning */
    return r;
}

static PyObject *mask_guard(PyObject *Py_UNUSED(self), PyObject *const *args, size_t nargsf,
                            PyObject *kwnames)
{
    int held = mask_hold();
    PyObject *r = PyObject_Vectorcall(guarded[1], args, nargsf, kwnames);
    if (held)
        mask_resume(held);
    return r;
}

static PyMethodDef guard_defs[] = {
    {"signal", (PyCFunction)(void (*)(void))signal_guard, METH_FASTCALL | METH_KEYWORDS,
     "signal(signalnum, handler, /)\n--\n\n"
     "_signal.signal, guarded by aioprof while its sampler signals the main thread: the\n"
     "sampler stops sending its signal before the signal is changed (docs/stacks.md)."},
    {"pthread_sigmask", (PyCFunction)(void (*)(void))mask_guard, METH_FASTCALL | METH_KEYWORDS,
     "pthread_sigmask(how, mask, /)\n--\n\n"
     "_signal.pthread_sigmask, guarded by aioprof while its sampler signals the main\n"
     "thread: the sampler sends no signal the main thread blocks (docs/stacks.md)."},
};
static PyObject *guard_funcs[2];   /* made once */

/* Put the guards in place of _signal.signal and _signal.pthread_sigmask, each unless
 * something else already replaced it. Main thread, GIL held. Returns 0, or -1 with an
 * exception. */
static int signal_guard_install(void)
{
    PyObject *mod = PyImport_ImportModule("_signal");
    PyObject *name = mod ? PyUnicode_FromString("_signal") : NULL;   /* their __module__ */
    int rc = name ? 0 : -1;
    for (int i = 0; i < 2 && rc == 0; i++) {
        PyObject *cur = PyObject_GetAttrString(mod, guard_defs[i].ml_name);
        if (cur && !guarded[i])
            guarded[i] = Py_NewRef(cur);
        if (cur && !guard_funcs[i])
            guard_funcs[i] = PyCFunction_NewEx(&guard_defs[i], NULL, name);
        if (!cur || !guard_funcs[i])
            rc = -1;
        else if (cur == guarded[i])
            rc = PyObject_SetAttrString(mod, guard_defs[i].ml_name, guard_funcs[i]);
        Py_XDECREF(cur);
    }
    Py_XDECREF(name);
    Py_XDECREF(mod);
    return rc;
}

/* Put the originals back, where the guards are still in place (any thread, GIL held). */
static void signal_guard_remove(void)
{
    ap_exc_state_t exc;
    ap_exc_save(&exc);
    PyObject *mod = PyImport_ImportModule("_signal");
    for (int i = 0; mod && i < 2; i++) {
        PyObject *cur = guard_funcs[i] ? PyObject_GetAttrString(mod, guard_defs[i].ml_name) : NULL;
        if (cur && cur == guard_funcs[i] &&
            PyObject_SetAttrString(mod, guard_defs[i].ml_name, guarded[i]) < 0)
            PyErr_WriteUnraisable(NULL);
        Py_XDECREF(cur);
    }
    Py_XDECREF(mod);
    PyErr_Clear();
    ap_exc_restore(&exc);
}
#else
static void signal_guard_remove(void) {}   /* 3.13+ sends no signal */
static void signal_fallback(int Py_UNUSED(lost)) {}
#endif

/* fork(): the child has no sampler thread, and the lock the sampler sends with must not
 * be copied held (signal.signal in the child, e.g. a subprocess preexec_fn, would wait on
 * it forever). The child's sampler counts as stopped. */
/* On 3.12+ os.fork() warns (DeprecationWarning) when the process has other threads, as
 * the kernel counts them: the watchdog, on by default, must not make a forking program
 * warn. So it leaves before a fork (woken, and joined) and the next step starts a new
 * one, after os.fork() has looked. Woken, it needs only the CPU to leave, which a loaded
 * machine may give it late: it is waited for up to 2 s, in 10 ms joins, unless it is
 * taking the GIL, which the forking thread holds: then it cannot leave before the fork
 * and is not waited for (it leaves once it has the GIL). */
static void fork_prepare(void)
{
    if (ap_sampling.started && S.watch && S.watch_joinable) {
        pthread_mutex_lock(&S.watch_lock);
        atomic_fetch_add(&S.gen, 1);
        pthread_cond_broadcast(&S.watch_cond);
        pthread_mutex_unlock(&S.watch_lock);
        int joined = 0;
        for (int i = 0; i < 200 && !joined && !atomic_load(&S.watch_wants_gil); i++) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 10000000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            joined = pthread_timedjoin_np(S.thread, NULL, &until) == 0;
        }
        if (!joined)
            pthread_detach(S.thread);
        S.watch_joinable = 0;
        atomic_store(&S.watch_restart, 1);
    }
    pthread_mutex_lock(&S.send_lock);
}
static void fork_parent(void) { pthread_mutex_unlock(&S.send_lock); }

static int sampler_thread_start(void);

/* The watchdog back after a fork (parent, GIL held): from a pending call that os.fork()'s
 * after_in_parent hook queues (it runs once os.fork() has returned, and so has counted
 * the threads: 3.13 runs the hook before it counts), or at the next step. */
static void watch_restart(void)
{
    if (atomic_load_explicit(&S.watch_restart, memory_order_relaxed) && atomic_exchange(&S.watch_restart, 0) &&
        ap_sampling.started && sampler_thread_start() < 0)
        ap_sampling.started = 0;   /* no thread: the slow steps still come, without their lines */
}

static int restart_pending(void *Py_UNUSED(arg))
{
    watch_restart();
    return 0;
}

static PyObject *after_fork_parent(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(unused))
{
    if (atomic_load(&S.watch_restart))
        Py_AddPendingCall(restart_pending, NULL);   /* full queue: the next step does it */
    Py_RETURN_NONE;
}

static PyMethodDef after_fork_def = {"_watchdog_after_fork", after_fork_parent, METH_NOARGS,
                                     "aioprof: the watchdog thread back after os.fork() (parent)."};

/* os.register_at_fork(after_in_parent=...) once per process; errors are ignored (the
 * watchdog then comes back at the next step). */
static void register_after_fork(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    PyObject *os = PyImport_ImportModule("os");
    PyObject *reg = os ? PyObject_GetAttrString(os, "register_at_fork") : NULL;
    PyObject *fn = reg ? PyCFunction_New(&after_fork_def, NULL) : NULL;
    PyObject *args = fn ? PyTuple_New(0) : NULL;
    PyObject *kw = args ? Py_BuildValue("{s:O}", "after_in_parent", fn) : NULL;
    PyObject *r = kw ? PyObject_Call(reg, args, kw) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(kw);
    Py_XDECREF(args);
    Py_XDECREF(fn);
    Py_XDECREF(reg);
    Py_XDECREF(os);
    PyErr_Clear();
}
static void fork_child(void)
{
    pthread_mutex_init(&S.send_lock, NULL);
    pthread_mutex_init(&S.watch_lock, NULL);
    atomic_store(&S.watch_restart, 0);
    atomic_store(&S.watch_wants_gil, 0);
    atomic_fetch_add(&S.gen, 1);
    atomic_store(&S.signum, 0);
    ap_sampling.started = 0;
    ap_sampling.main_mode = 0;
    S.masked = 0;
    atomic_store(&S.handled, 1);
}

/* Start the sampler (or watchdog) thread of a new generation: 0, or -1. The watchdog
 * stays joinable (a fork waits for it to leave); the sampler is detached.
 * The thread is born with every asynchronous signal blocked: a signal sent to the process
 * (SIGTERM, SIGINT, SIGCHLD, ...) must go to the program's threads. The kernel may give it
 * to any thread that does not block it, and a Python handler run from another thread
 * does not interrupt the main thread's blocking call (time.sleep, a read): the program
 * would see its SIGTERM only once that call returned. */
static int sampler_thread_start(void)
{
    unsigned long long gen = atomic_fetch_add(&S.gen, 1) + 1;
    sigset_t all, old;
    sigfillset(&all);
    const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
    for (size_t i = 0; i < sizeof sync_signals / sizeof sync_signals[0]; i++)
        sigdelset(&all, sync_signals[i]);   /* faults of the thread itself */
    int masked = pthread_sigmask(SIG_BLOCK, &all, &old) == 0;
    int rc = pthread_create(&S.thread, NULL, S.watch ? watchdog_main : sampler_main, (void *)(uintptr_t)gen);
    if (masked)
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        atomic_fetch_add(&S.gen, 1);
        return -1;
    }
    if (S.watch)
        S.watch_joinable = 1;
    else
        pthread_detach(S.thread);
    return 0;
}

int ap_sampler_start(ap_session_t *s, PyObject *signal_handler)
{
    static int atfork;
    if (!atfork && pthread_atfork(fork_prepare, fork_parent, fork_child) == 0)
        atfork = 1;
    /* The watchdog: without sampling, for slow_ns > 0 (0 makes every step slow), unless
     * AIOPROF_WATCHDOG=0 (docs/stacks.md). */
    const char *env = getenv("AIOPROF_WATCHDOG");
    S.watch = !s->sample_interval && s->slow_ns > 0 && !(env && strcmp(env, "0") == 0);
    if (!s->sample_interval && !S.watch)
        return 0;
    S.slow_ns = s->slow_ns;
    atomic_store(&S.n_slots, 0);
    atomic_store(&S.unslotted, 0);
    for (int i = 0; i < WATCH_SLOTS; i++)
        atomic_store(&S.starts[i], 0);
    S.interval.tv_sec = (time_t)(s->sample_interval / 1000000000);
    S.interval.tv_nsec = (long)(s->sample_interval % 1000000000);
    atomic_store(&S.busy, 0);
    atomic_store(&S.main_busy, 0);
    atomic_store(&S.outstanding, 0);
    atomic_store(&S.queued, 0);
    ap_sampling.main_ident = main_thread_ident();
    atomic_store(&S.signum, 0);
    ap_sampling.main_mode = 0;
    S.has_main_cpu = 0;
    if (S.watch) {
        /* every thread GIL-sampled, the main thread too: no signal, no pending call */
        (void)signal_handler;
    } else {
#if PY_VERSION_HEX >= 0x030D0000
        (void)signal_handler;   /* a pending call reaches the main thread at once */
        ap_sampling.main_mode = ap_sampling.main_ident ? AP_SAMPLE_LOOP : 0;
#else
        if (signal_handler && !S.handler)
            S.handler = Py_NewRef(signal_handler);
        S.taken = 0;
        S.warned = 0;
        atomic_store(&S.lost, 0);
        int sig = ap_sampling.main_ident && signal_handler ? sampling_signal(signal_handler) : 0;
        if (sig && signal_guard_install() < 0) {
            PyErr_Clear();   /* unguarded, the signal is not sent: the GIL sampler instead */
            sig = 0;
        }
        atomic_store(&S.signum, sig);
        ap_sampling.main_mode = sig ? AP_SAMPLE_LOOP : 0;
        S.has_main_cpu = sig && pthread_getcpuclockid((pthread_t)ap_sampling.main_ident, &S.main_cpu) == 0;
        S.probe_cpu = -1;
        atomic_store(&S.handled, 1);
        S.masked = 0;
        sigset_t cur;   /* this is the main thread (sampling_signal): its mask now */
        if (sig && pthread_sigmask(SIG_BLOCK, NULL, &cur) == 0 && sigismember(&cur, sig) == 1) {
            S.masked = sig;
            atomic_store(&S.signum, 0);
        }
#endif
    }
    if (S.watch && !S.watch_cond_ready) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        S.watch_cond_ready = pthread_cond_init(&S.watch_cond, &attr) == 0;
        pthread_condattr_destroy(&attr);
        if (!S.watch_cond_ready) {
            PyErr_SetString(PyExc_RuntimeError, "aioprof: cannot start the watchdog");
            return -1;
        }
    }
    atomic_store(&S.watch_restart, 0);
    if (S.watch)
        register_after_fork();
    if (sampler_thread_start() < 0) {
        PyErr_SetString(PyExc_RuntimeError, "aioprof: cannot start the sampler thread");
        return -1;
    }
    ap_sampling.started = 1;
    return 0;
}

void ap_sampler_stop(void)
{
    if (!ap_sampling.started)
        return;
    /* Under send_lock: once the generation moved, this sampler sends nothing more. */
    pthread_mutex_lock(&S.send_lock);
    atomic_fetch_add(&S.gen, 1);   /* the sampler leaves at its next look; not waited for */
    pthread_mutex_unlock(&S.send_lock);
    if (S.watch) {
        pthread_mutex_lock(&S.watch_lock);
        pthread_cond_broadcast(&S.watch_cond);   /* leave now */
        pthread_mutex_unlock(&S.watch_lock);
        if (S.watch_joinable)
            pthread_detach(S.thread);   /* not joined: it may be waiting for the GIL we hold */
        S.watch_joinable = 0;
    }
    atomic_store(&S.watch_restart, 0);
    ap_sampling.started = 0;
    signal_guard_remove();
}

void ap_sampler_step(ap_thread_t *th, ap_ns_t now, int begin)
{
    atomic_int *busy = th->sampled == AP_SAMPLE_LOOP ? &S.main_busy : &S.busy;
    if (S.watch && th->watch_slot == 0) {
        int slot = atomic_fetch_add(&S.n_slots, 1);
        th->watch_slot = slot < WATCH_SLOTS ? slot + 1 : -1;
        if (slot >= WATCH_SLOTS)
            atomic_store(&S.unslotted, 1);
    }
    if (th->watch_slot > 0)
        atomic_store_explicit(&S.starts[th->watch_slot - 1], begin ? now : 0, memory_order_relaxed);
    if (begin) {
        watch_restart();
        th->step_start = now;
        th->step_serial++;
        th->block_site1 = 0;
        if (th->sampled == AP_SAMPLE_LOOP)
            atomic_store_explicit(&S.step_signals, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(busy, 1, memory_order_relaxed);
    } else {
        th->handle_ns += now - th->step_start;
        /* The step's time after its last sample goes to the stack that sample saw: the
         * step's own best guess, never the next step's. */
        ap_session_t *s = ap_session;
        if (s && s->sample_interval && th->last_stack1 && th->last_stack_step == th->step_serial &&
            th->handle_ns > th->sampled_ns && th->last_stack1 <= s->n_stacks) {
            s->stacks[th->last_stack1 - 1].sample_ns += th->handle_ns - th->sampled_ns;
            th->sampled_ns = th->handle_ns;
        }
        th->step_start = 0;
        atomic_fetch_sub_explicit(busy, 1, memory_order_relaxed);
    }
}

/* ------------------------------------------------------------------ snapshot */

static PyObject *frame_obj(ap_session_t *s, const ap_frame_t *f)
{
    switch (f->kind) {
    case FR_CODE: {
        ap_site_t *st = &s->sites[f->ref];
        ap_code_t *c = &s->codes[st->code];
        return Py_BuildValue("{s:s,s:O,s:i,s:O}", "kind", "code", "file", c->filename, "line", st->line,
                             "function", c->qualname);
    }
    case FR_TASK:
        return Py_BuildValue("{s:s,s:O}", "kind", "task", "coroutine",
                             f->ref != AP_NONE ? s->codes[f->ref].qualname : Py_None);
    case FR_CALLBACK:
        return Py_BuildValue("{s:s,s:O}", "kind", "callback", "callback", s->cbs[f->ref].name);
    default:
        return Py_BuildValue("{s:s}", "kind", "asyncio");
    }
}

static PyObject *stack_list(const ap_stack_t *st)
{
    PyObject *l = PyList_New(st->n);
    for (uint32_t i = 0; l && i < st->n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(st->frames[i]);
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

int ap_stacks_snapshot(ap_session_t *s, PyObject *doc)
{
    if (!s->sample_interval && !s->async_stacks && !s->slow_ns)
        return 0;
    PyObject *frames = PyList_New(0), *samples = PyList_New(0), *idle = PyList_New(0), *blocking = PyList_New(0);
    int rc = -1;
    if (!frames || !samples || !idle || !blocking)
        goto done;
    for (uint32_t i = 0; i < s->n_frames; i++) {
        PyObject *o = frame_obj(s, &s->frames[i]);
        if (!o || PyList_Append(frames, o) < 0) {
            Py_XDECREF(o);
            goto done;
        }
        Py_DECREF(o);
    }
    for (uint32_t i = 0; i < s->n_stacks; i++) {
        ap_stack_t *st = &s->stacks[i];
        PyObject *o;
        if (st->samples) {
            o = Py_BuildValue("{s:N,s:K,s:L}", "stack", stack_list(st), "samples", (unsigned long long)st->samples,
                              "time_ns", (long long)st->sample_ns);
            if (!o || PyList_Append(samples, o) < 0)
                goto fail_item;
            Py_DECREF(o);
        }
        if (st->idle_count) {
            o = Py_BuildValue("{s:N,s:K,s:L}", "stack", stack_list(st), "count", (unsigned long long)st->idle_count,
                              "idle_ns", (long long)st->idle_ns);
            if (!o || PyList_Append(idle, o) < 0)
                goto fail_item;
            Py_DECREF(o);
        }
        if (st->blocking) {
            o = Py_BuildValue("{s:N,s:K}", "stack", stack_list(st), "count", (unsigned long long)st->blocking);
            if (!o || PyList_Append(blocking, o) < 0)
                goto fail_item;
            Py_DECREF(o);
        }
        continue;
    fail_item:
        Py_XDECREF(o);
        goto done;
    }
    if (PyDict_SetItemString(doc, "frames", frames) < 0)
        goto done;
    if (s->sample_interval) {
        PyObject *sm = Py_BuildValue("{s:L,s:K,s:L,s:O}", "interval_ns", (long long)s->sample_interval, "count",
                                     (unsigned long long)s->n_samples, "uncharged_ns", (long long)s->uncharged_ns,
                                     "stacks", samples);
        if (!sm || PyDict_SetItemString(doc, "samples", sm) < 0) {
            Py_XDECREF(sm);
            goto done;
        }
        Py_DECREF(sm);
    }
    if ((s->sample_interval || s->slow_ns) && PyDict_SetItemString(doc, "blocking", blocking) < 0)
        goto done;
    if (s->async_stacks && PyDict_SetItemString(doc, "idle_stacks", idle) < 0)
        goto done;
    rc = 0;
done:
    Py_XDECREF(frames);
    Py_XDECREF(samples);
    Py_XDECREF(idle);
    Py_XDECREF(blocking);
    return rc;
}
