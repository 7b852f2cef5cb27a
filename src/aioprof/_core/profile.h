/* profile.h - the data of one profiling session and the functions that update it.
 *
 * One session runs at a time in a process (the hooks sit on shared standard-library
 * classes), so the hot path reaches it through one pointer, ap_session. Everything
 * here is touched only with the GIL held.
 *
 * Ownership: records hold strong references only to code objects and strings (they
 * live with the program's code), and to weak references of tasks and loops. Never to
 * a task, coroutine or frame. */
#ifndef AP_PROFILE_H
#define AP_PROFILE_H

#include "compat.h"
#include "clock.h"
#include "hist.h"
#include "table.h"

#define AP_NONE UINT32_MAX
#define AP_MAX_CHAIN 48      /* await-chain frames kept per suspension */
#define AP_CPU_PENDING 256   /* handles per CPU window before a forced read */
#define AP_SLOW_KEEP 200     /* slow steps kept per loop (the longest) */
#define AP_RING 4096         /* call_soon ready times remembered per loop */
#define AP_LOOPS_ENDED_KEEP 8   /* ended loops kept in full; older, smaller ones are folded */
#define AP_LOOP_GROUPS 32    /* folded groups (thread name, loop class) before "other threads" */
#define AP_TRACE_THREADS 64  /* threads told apart in the trace */

/* Per code object: names and where it lives. Index into s->codes. */
typedef struct {
    PyObject *code;       /* strong */
    PyObject *qualname;   /* strong str */
    PyObject *filename;   /* strong str */
    int firstlineno;
    unsigned is_asyncio : 1, is_aioprof : 1, is_internal : 1;
    unsigned is_loop_entry : 1;   /* asyncio code that calls into handles: stacks stop there */
    unsigned is_create_task : 1;  /* BaseEventLoop.create_task: what it calls is the task factory */
    unsigned is_handle_runner : 1;   /* _run_once, Handle._run: what the loop runs handles from */
    unsigned is_library : 1;      /* not the program's: stdlib, site-/dist-packages, aioprof */
    uint32_t coro;        /* index into s->coros once used as a task's coroutine */
} ap_code_t;

/* A line in an await chain or a creation site: (code, line). Index into s->sites. */
typedef struct {
    uint32_t code;
    int line;
    uint64_t count, inner_count;
    ap_ns_t idle, inner_idle;
    uint64_t slow;        /* slow steps that ended suspended here */
} ap_site_t;

/* An interned await chain: site indices, outermost first. Index into s->chains. */
typedef struct {
    uint32_t n;
    uint32_t *sites;
} ap_chain_t;

/* Per coroutine function of a task. Index into s->coros. */
typedef struct {
    uint32_t code;
    uint64_t tasks, steps, slow;
    ap_ns_t busy, cpu, scheduled, idle, max_step;
    ap_hist_t hist;
} ap_coro_t;

/* Per other callback (not a task step). Index into s->cbs. */
typedef struct {
    PyObject *name;       /* strong str */
    uint32_t code;        /* AP_NONE for built-ins */
    int internal;
    uint64_t count, slow;
    ap_ns_t busy, cpu, max_step;
} ap_cb_t;

typedef struct {
    uint32_t chain;
    uint32_t count;
    ap_ns_t idle;
} ap_await_t;

enum { AP_READY, AP_RUNNING, AP_SUSPENDED, AP_DONE };
enum { AP_SAMPLE_GIL = 1, AP_SAMPLE_LOOP = 2 };   /* how a thread is sampled (stacks.c) */
enum { AP_R_PENDING, AP_R_DONE, AP_R_CANCELLED, AP_R_FAILED };

typedef struct ap_task {
    uint64_t id;
    uintptr_t addr;       /* the task object's address while it lives (table key) */
    PyObject *wr;         /* strong ref to a weak reference to the task */
    PyObject *coro;       /* borrowed: valid only while the task is alive and pending */
    PyObject *name;       /* strong str */
    PyObject *exc_name;   /* strong str or NULL */
    PyObject *coro_name;  /* strong str: qualname of a coroutine that has no code (Cython) */
    uint32_t coro_idx;    /* index into s->coros */
    uint32_t created;     /* site index or AP_NONE */
    uint32_t created_via; /* the innermost library frame the walk went through to `created`, or AP_NONE */
    /* Made while a handle ran but by no Python frame of the program (a callback such as
     * loop.create_task itself, compiled code): the callback's or the creating task's
     * coroutine's name and file (strong str, or NULL), and created stays AP_NONE. */
    PyObject *created_by, *created_by_file;
    uint64_t parent;      /* task id or 0 */
    unsigned long thread;
    int state, result;
    unsigned kept : 1, internal : 1, woke_in_step : 1, need_walk : 1, destroyed : 1;
    unsigned by_loop : 1;   /* made while a handle ran by no frame of the program (created_by) */
    uint64_t steps, yields;
    ap_ns_t busy, cpu, scheduled, idle, max_step;
    ap_ns_t t_created, t_first, t_end, t_mark, t_step;
    ap_ns_t susp_idle;    /* idle of the last suspension, charged at the next walk */
    ap_ns_t t_susp;       /* when the last suspension began (for the trace) */
    uint32_t last_site;   /* await site it last resumed from (AP_NONE if unknown) */
    ap_await_t *awaits;
    uint32_t n_awaits, cap_awaits;
} ap_task_t;

typedef struct {
    ap_ns_t dur;
    uint64_t task;        /* task id, 0 for a callback */
    uint32_t coro;        /* coroutine index or AP_NONE */
    uint32_t cb;          /* callback index or AP_NONE */
    uint32_t site_start, site_end;
    uint32_t site_block1; /* site + 1 of the line it was at when it ran past slow_ns, 0: unknown */
    uint32_t handles;     /* for a slow tick: handles run in it */
    int is_tick;
    ap_ns_t at;           /* start, since the session began */
} ap_slow_t;

typedef struct {
    uintptr_t handle;
    ap_ns_t ready;
} ap_ready_t;

/* A frame of an async call stack: a code line (ref = site), a task marker (ref = code
 * of its coroutine), a callback marker (ref = callback) or the [asyncio] marker. */
typedef struct {
    uint8_t kind;
    uint32_t ref;
} ap_frame_t;

/* An interned async call stack (frame indices, root first) and what was charged to it. */
typedef struct {
    uint32_t n;
    uint32_t *frames;
    uint64_t samples, idle_count, blocking;
    ap_ns_t sample_ns, idle_ns;
} ap_stack_t;

enum { AP_EV_RUN, AP_EV_SCHEDULED, AP_EV_AWAIT, AP_EV_TICK, AP_EV_SELECT, AP_EV_CREATE };

typedef struct {
    uint8_t kind;
    uint32_t n;           /* site, callback, handles or events, by kind */
    uint64_t a, b;        /* task id / loop+thread / parent, by kind */
    ap_ns_t t0, t1;
} ap_trace_ev_t;

/* Per event loop. */
typedef struct ap_loop {
    uint64_t id;
    uintptr_t addr;
    PyObject *wr;         /* strong ref to a weak reference to the loop */
    PyObject *type_name;  /* strong str */
    PyObject *module;     /* strong str: the loop class's __module__, or NULL */
    PyObject *thread_name;   /* strong str: its thread's name when first seen, or NULL */
    unsigned long thread;
    uint64_t folded;      /* a group of ended loops (s->loop_groups): how many */
    int real_time;        /* loop.time() is time.monotonic(): timer due times are comparable */
    unsigned destroyed : 1, uvloop : 1;   /* uvloop: no ticks, select or callbacks seen */
    uint64_t ticks, handles, select_calls, io_events;
    ap_ns_t wall, select_wait, select_capped, overhead_cpu;
    ap_ns_t step_busy;    /* uvloop: time inside the handles the hooks see (no ticks) */
    ap_ns_t first_seen, last_tick_end;
    double load_ewma;
    ap_hist_t tick_hist, handles_hist, lag_hist, timer_hist;
    ap_slow_t slow[AP_SLOW_KEEP];
    uint32_t n_slow;
    uint64_t slow_total;
    /* FIFO of (handle, ready time) for plain call_soon handles: see hooks.c. AP_RING
     * entries, allocated at the first push, freed when the loop ends. */
    ap_ready_t *ring;
    uint32_t ring_head, ring_len;
} ap_loop_t;

/* Work waiting for the next CPU clock read (see design.md, "CPU time"). */
typedef struct {
    ap_task_t *task;      /* kept task record (never freed in-session) or NULL */
    uint32_t coro, cb;    /* aggregate to charge, AP_NONE if none */
    ap_loop_t *loop;      /* loop-overhead share if task, coro and cb are all none */
    ap_ns_t weight;
} ap_cpu_item_t;

/* An eager first step that is running (see tasks.c, "eager tasks"). */
typedef struct {
    struct ap_task *t;        /* its record (the task object lives: Task() is running) */
    PyObject *task;           /* borrowed: the task */
    PyObject *key, *prev;     /* borrowed, compared only: the loop, and its current task before */
    struct ap_task *prev_task;   /* what ran before: th->task, th->cb, and their accounting */
    uint32_t prev_cb;
    ap_ns_t begin, prev_nested, prev_charged;
} ap_eager_t;

#define AP_MAX_EAGER 8

/* Per thread that ran a hook. */
typedef struct ap_thread {
    struct ap_thread *next;
    unsigned long ident;
    ap_loop_t *loop;      /* loop whose tick is running in this thread, or NULL */
    int depth;            /* nesting of handle runs (eager steps, manual _run) */
    ap_task_t *task;      /* task whose step runs now, or NULL */
    uint32_t cb;          /* callback running now (AP_NONE if none or a task step) */
    int sampled;          /* 0, or how it is sampled (AP_SAMPLE_*): publish handle starts/ends */
    PyThreadState *tstate;   /* this thread's, for the sampler (valid while inside a handle) */
    ap_ns_t step_start;
    ap_ns_t handle_ns;       /* wall time inside handles so far (sampled threads) */
    ap_ns_t sampled_ns;      /* handle_ns (+ the running handle) at the last sample */
    uint64_t step_serial, blocked_step;
    uint32_t block_site1;    /* site + 1 of the blocking capture of step blocked_step, 0: none */
    uint32_t last_stack1;    /* stack + 1 of the last sample, taken in step last_stack_step */
    uint64_t last_stack_step;
    int watch_slot;          /* slot + 1 of this thread's step start for the watchdog, -1: none */
    /* the awaiting-task prefix of the running task's stack, computed once per step */
    uint64_t prefix_step;
    uint32_t prefix[64], n_prefix;
    /* Eager first steps (3.12+) running in this thread, innermost last (tasks.c). A
     * handle's busy time excludes the eager steps run inside it (nested), and its CPU
     * weight is queued in segments around them (charged: what is queued already). */
    ap_eager_t eager[AP_MAX_EAGER];
    int n_eager;
    PyObject *cur_ctx;    /* 3.14+, compared only: the context this thread switched to last */
    ap_ns_t nested, charged, seg_start;
    ap_ns_t cur_ready;    /* ready time given to wake-ups made by the running handle; -1 = now */
    ap_ns_t io_end;       /* when select last returned in this thread */
    ap_ns_t tick_select;  /* select wait inside the current tick */
    ap_ns_t tick_capped;  /* the same, each select capped at its timeout (for the load) */
    uint32_t tick_handles;
    ap_ns_t last_edge;    /* end of the last handle or select: loop overhead starts here */
    /* Read once per tick for the C _call_soon (hooks.c): the ticking loop (borrowed),
     * its _ready deque and asyncio.events.Handle (strong; NULL: look them up). */
    PyObject *tick_loop_obj, *tick_ready, *tick_handle_cls;
    ap_ns_t win_wall, win_cpu;
    uint32_t n_pending;
    ap_cpu_item_t pending[AP_CPU_PENDING];
} ap_thread_t;

typedef struct {
    uint64_t gen;         /* session number: hooks compare it to detect a stop mid-call */
    ap_ns_t t0, t_stop;
    uint64_t max_tasks, n_kept, dropped, next_task_id, next_loop_id;
    uint64_t tasks_ended[5];   /* finished tasks by result (AP_R_*), [4]: destroyed pending */
    ap_ns_t cpu_window, slow_ns;
    int disabled;         /* a fault switched accounting off */
    PyObject *faults;     /* list of str */
    PyObject *asyncio_dir, *aioprof_dir;   /* strong str, with trailing separator */
    PyObject *stdlib_dir;                  /* the same, of os.py: the standard library */
    PyObject *asyncio_all;                 /* asyncio.__all__: its public names */
    PyObject *task_types; /* tuple of task classes */
    PyObject *timer_type; /* asyncio.TimerHandle */
    PyObject *wr_task_cb, *wr_loop_cb;     /* C functions called when a task/loop dies */
    ap_table_t code_idx, site_idx, chain_idx, cb_idx, live, wr_tab, loop_idx;
    ap_table_t line_cache;   /* (code, instruction) -> line + 1: line tables are slow to read */
    ap_code_t *codes; uint32_t n_codes, cap_codes;
    ap_site_t *sites; uint32_t n_sites, cap_sites;
    ap_chain_t *chains; uint32_t n_chains, cap_chains;
    ap_coro_t *coros; uint32_t n_coros, cap_coros;
    ap_cb_t *cbs; uint32_t n_cbs, cap_cbs;
    ap_task_t **tasks; uint32_t n_tasks, cap_tasks;   /* kept records, in first-seen order */
    ap_loop_t **loops; uint32_t n_loops, cap_loops;
    /* Ended loops past AP_LOOPS_ENDED_KEEP, folded per (thread name, class): loopstats.c */
    ap_loop_t **loop_groups; uint32_t n_loop_groups, cap_loop_groups;
    uint64_t loops_folded;
    ap_thread_t *threads;
    /* stacks, samples (stacks.c) */
    ap_ns_t sample_interval;          /* 0: no sampling */
    int async_stacks;                 /* charge idle time to async call stacks */
    uint64_t n_samples;
    ap_ns_t uncharged_ns;             /* handle time of earlier handles no sample saw */
    ap_table_t frame_idx, stack_idx;
    ap_frame_t *frames; uint32_t n_frames, cap_frames;
    ap_stack_t *stacks; uint32_t n_stacks, cap_stacks;
    /* trace (trace.c) */
    ap_trace_ev_t *trace; uint32_t trace_cap; uint64_t trace_next;
    unsigned long trace_threads[AP_TRACE_THREADS]; uint32_t n_trace_threads;
} ap_session_t;

extern ap_session_t *ap_session;

/* --- session.c --- */
/* A new session (no hooks, no sampler: module.c starts them), with its faults list and
 * what it looks up once (package directories, task types); NULL with an error set. */
ap_session_t *ap_session_new(PyObject *module);
/* Free a session and every record it holds. */
void ap_session_free(ap_session_t *s);
/* Release a task record's references and memory. */
void ap_task_free(ap_task_t *t);
/* The same of a loop record, and of the async stack tables (s->frames, s->stacks). */
void ap_loop_free(ap_loop_t *l);
void ap_stacks_free(ap_session_t *s);
/* Grow a zero-filled dynamic array so that index n is valid; 0, or -1 (no error set). */
int ap_grow(void **arr, uint32_t *cap, size_t elem, uint32_t n);
/* Record an internal fault: the message goes to the report's warnings, accounting
 * stops for the rest of the session, and the Python error (if any) is cleared. */
void ap_fault(ap_session_t *s, const char *what);
/* How threads are sampled, for the thread records made from now on: written by the
 * sampler (stacks.c) when it starts and stops, read here (no call up into it). started:
 * a sampler or watchdog thread runs (else no thread is sampled); main_ident: the main
 * thread's PyThread ident; main_mode: AP_SAMPLE_LOOP when the main thread samples
 * itself, else 0 (every sampled thread is then AP_SAMPLE_GIL). */
typedef struct {
    int started;
    int main_mode;
    unsigned long main_ident;
} ap_sampling_t;
extern ap_sampling_t ap_sampling;
/* The calling thread's record, created on first use; NULL (and a fault) on no memory.
 * Its `sampled` is 0 (sampling off), AP_SAMPLE_GIL or AP_SAMPLE_LOOP, by ap_sampling. */
ap_thread_t *ap_thread_get(ap_session_t *s);
/* This thread's record, or NULL if it has none yet (creates none). */
ap_thread_t *ap_thread_peek(ap_session_t *s);

/* --- code.c --- */
/* Index of the code record of `code` (borrowed), creating it; AP_NONE on error. */
uint32_t ap_code_get(ap_session_t *s, PyObject *code);
/* Index of the site (code, line); AP_NONE on error. */
uint32_t ap_site_get(ap_session_t *s, PyObject *code, int line);
/* The line a frame is at (code is the frame's code), through s->line_cache. */
int ap_frame_line(ap_session_t *s, PyFrameObject *f, PyObject *code);
/* The task behind a loop callback (borrowed), or NULL when it is not a task step.
 * s may be NULL (loop monitors without a session): then any task step's shape counts. */
PyObject *ap_task_of_callback(ap_session_t *s, PyObject *callback);
/* Is obj a task (of s->task_types; any object when s is NULL)? */
int ap_is_task(ap_session_t *s, PyObject *obj);
/* The interned await chain `coro` is suspended in now (walked from the outermost
 * coroutine down cr_await / gi_yieldfrom); AP_NONE if none or on error. */
uint32_t ap_chain_of(ap_session_t *s, PyObject *coro);
/* The await site of a chain: its innermost frame outside asyncio. */
uint32_t ap_chain_site(ap_session_t *s, uint32_t chain);
/* The innermost line of a chain in the program's own code (not in the standard library,
 * site-/dist-packages or aioprof), or AP_NONE. */
uint32_t ap_chain_user_site(ap_session_t *s, uint32_t chain);

/* --- tasks.c --- */
/* The record of a live task object, or NULL if not seen yet. */
ap_task_t *ap_task_find(ap_session_t *s, PyObject *task);
/* First sight of a task (in call_soon or at a step). fresh: 1 = created just now,
 * -1 = tell from its coroutine. coro: the task's coroutine if the caller knows it
 * (borrowed), else NULL to ask task.get_coro(). Returns NULL on error (faulted). */
ap_task_t *ap_task_new(ap_session_t *s, ap_thread_t *th, PyObject *task, ap_ns_t now, int fresh,
                       PyObject *coro);
/* Watch asyncio's current-task dicts for eager first steps (3.12+; a no-op before):
 * start returns 0, or -1 with an error set; stop never fails. */
int ap_eager_watch_start(ap_session_t *s);
void ap_eager_watch_stop(void);
/* A handle begins at `now` in this thread: no eager step is nested in it yet. */
static inline void ap_handle_segments_reset(ap_thread_t *th, ap_ns_t now)
{
    th->nested = th->charged = 0;
    th->seg_start = now;
    th->n_eager = 0;
}
/* The task was made ready at `ready` (clamped into [t_mark, now]). */
void ap_task_wake(ap_session_t *s, ap_thread_t *th, ap_task_t *t, ap_ns_t ready, ap_ns_t now);
/* A step of the task begins/ends at `now`; `task` is the live task object. */
void ap_task_step_begin(ap_session_t *s, ap_thread_t *th, ap_task_t *t, PyObject *task, ap_ns_t now);
/* step_end returns the task's new state; after AP_DONE the record may be freed. */
int ap_task_step_end(ap_session_t *s, ap_thread_t *th, ap_task_t *t, PyObject *task, ap_ns_t now);
/* Charge one suspension of `idle` ns to every line of the chain and to the task's
 * await sites. 0, or -1 on out of memory (error set). */
int ap_chain_charge(ap_session_t *s, ap_task_t *t, uint32_t chain, ap_ns_t idle);
/* Record of a non-task callback; AP_NONE on error. */
uint32_t ap_cb_get(ap_session_t *s, PyObject *callback);
/* Creation site of the code running now: the first frame of the program's own code,
 * skipping asyncio's, aioprof's and a task factory's frames (those inside
 * BaseEventLoop.create_task) and walking through library frames, the innermost of which
 * goes to *via (else AP_NONE). With no frame of the program, the innermost library line
 * (via AP_NONE), or AP_NONE if there is none; *by_loop is then 1 when the walk reached
 * the frames that run handles while a handle runs (no frame of the program made it). */
uint32_t ap_creation_site(ap_session_t *s, const ap_thread_t *th, int *by_loop, uint32_t *via);
/* Read the task's name again (it may have been set after creation). Never fails. */
void ap_task_refresh_name(ap_task_t *t, PyObject *task);
/* Weak-reference callback: the task object died (possibly never finished). */
PyObject *ap_task_died(PyObject *module, PyObject *wr);

/* --- cpu windows (tasks.c) --- */
/* Queue a handle's wall time for the CPU share of the current window; reads the CPU
 * clock when the window is over (now - win_wall >= cpu_window) or the queue is full. */
void ap_cpu_charge(ap_session_t *s, ap_thread_t *th, ap_cpu_item_t item, ap_ns_t now);
/* Read the CPU clock now and share the window among the queued handles. */
void ap_cpu_flush(ap_session_t *s, ap_thread_t *th, ap_ns_t now);

/* --- loopstats.c --- */
ap_loop_t *ap_loop_get(ap_session_t *s, PyObject *loop, ap_ns_t now);
void ap_loop_tick_end(ap_session_t *s, ap_thread_t *th, ap_loop_t *l, ap_ns_t t0, ap_ns_t t1);
void ap_loop_select(ap_session_t *s, ap_loop_t *l, ap_ns_t t0, ap_ns_t t1, ap_ns_t timeout, Py_ssize_t events);
void ap_loop_lag(ap_loop_t *l, ap_ns_t lag, int timer);
void ap_loop_slow(ap_session_t *s, ap_loop_t *l, const ap_slow_t *rec);
void ap_loop_ring_push(ap_loop_t *l, uintptr_t handle, ap_ns_t ready);
/* Ready time of a plain handle queued by call_soon, or -1 if it was not (I/O). */
ap_ns_t ap_loop_ring_pop(ap_loop_t *l, uintptr_t handle);
PyObject *ap_loop_died(PyObject *module, PyObject *wr);
/* Fold the ended loops past AP_LOOPS_ENDED_KEEP into s->loop_groups; with check_closed,
 * first mark the loops the program closed (is_closed(), Python code) as ended. Never
 * raises; the error indicator is kept. */
void ap_loop_sweep(ap_session_t *s, int check_closed);

/* --- stacks.c --- */
/* Charge a suspension's idle time to the task's async call stack (awaiters + chain). */
void ap_stack_charge_idle(ap_session_t *s, PyObject *task, ap_task_t *t, uint32_t chain, ap_ns_t idle);
/* Start/stop the sampler thread (no-op when sampling is off). start: 0 or -1 with error. */
int ap_sampler_start(ap_session_t *s, PyObject *signal_handler);
void ap_sampler_stop(void);
PyObject *ap_sample_signal(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* This thread begins (begin = 1) or ends (0) a handle at `now`: for the sampler. */
void ap_sampler_step(ap_thread_t *th, ap_ns_t now, int begin);
/* site + 1 of the line the watchdog found the thread's step at once it ran past slow_ns
 * (read right after the step's end: an ap_slow_t's site_block1), or 0. */
uint32_t ap_sampler_blocked_at(const ap_thread_t *th);
/* Add frames/samples/idle_stacks/blocking to a snapshot dict; 0 or -1 with error. */
int ap_stacks_snapshot(ap_session_t *s, PyObject *doc);

/* --- trace.c --- */
int ap_trace_init(ap_session_t *s, uint32_t capacity);
void ap_trace_add(ap_session_t *s, int kind, uint64_t a, uint64_t b, ap_ns_t t0, ap_ns_t t1, uint32_t n);
uint64_t ap_trace_where(ap_session_t *s, ap_loop_t *l, unsigned long thread);
int ap_trace_snapshot(ap_session_t *s, PyObject *doc);

/* --- hooks.c --- */
/* Take a reference on the hooks, installing them on the standard-library classes
 * when they were not: 0, or -1 with an exception set. */
int ap_hooks_acquire(void);
/* Drop a reference; the last one puts the original methods back (never fails). */
void ap_hooks_release(void);
/* Hook uvloop now that the program has imported it, if the hooks are installed. */
int ap_hooks_uvloop(void);

/* --- snapshot.c --- */
/* The session's figures as a dict of lists and ints (ns), as of `now`. New ref. */
PyObject *ap_snapshot(ap_session_t *s, ap_ns_t now);
/* The figures of the Prometheus collector (aioprof.metrics) only: no task, site or
 * stack records, so cheap enough to take at every scrape (snapshot.c). */
PyObject *ap_metrics(ap_session_t *s, ap_ns_t now);

#endif /* AP_PROFILE_H */
