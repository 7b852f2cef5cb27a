/* monitor.h - loop monitors (see monitor.c): observers of the loop events and the
 * smoothed load of one loop, with or without a profiling session. */
#ifndef AP_MONITOR_H
#define AP_MONITOR_H

#include "profile.h"

typedef struct ap_monitor ap_monitor_t;

/* Number of open monitors: the hooks look one up only when it is non-zero. */
extern int ap_monitor_count;
/* Bumped whenever a monitor is closed: a saved monitor pointer is stale after it. */
extern uint64_t ap_monitor_epoch;

/* The open monitor of `loop`, or NULL. */
ap_monitor_t *ap_monitor_find(PyObject *loop);
/* Events, called by the hooks with the GIL held. They never raise. */
void ap_monitor_loop_start(ap_monitor_t *m);
void ap_monitor_loop_stop(ap_monitor_t *m);
void ap_monitor_tick_start(ap_monitor_t *m, ap_ns_t now);
void ap_monitor_handle(ap_monitor_t *m);
void ap_monitor_tick_end(ap_monitor_t *m, ap_ns_t now);
/* timeout: as given to select (for observers); cap: as the selector waits (for the load). */
void ap_monitor_io_start(ap_monitor_t *m, ap_ns_t now, ap_ns_t timeout, ap_ns_t cap);
void ap_monitor_io_end(ap_monitor_t *m, ap_ns_t now, Py_ssize_t events);
/* A task step of a loop without hooked ticks (uvloop) begins / ends: its busy time. */
void ap_monitor_step_begin(ap_monitor_t *m, ap_ns_t now);
void ap_monitor_step_end(ap_monitor_t *m, ap_ns_t now);

/* Opening a monitor, for module.c's monitor_add(loop) -> id, which takes a reference
 * on the hooks between the two steps: new checks the loop has none and allocates (NULL
 * with an error set); open registers it and returns its id (never fails once new
 * succeeded but for the int: NULL with an error); discard frees an unopened one. */
ap_monitor_t *ap_monitor_new(PyObject *loop);
PyObject *ap_monitor_open(ap_monitor_t *m, PyObject *loop);
void ap_monitor_discard(ap_monitor_t *m);
/* Close the monitor `id`: 1, or 0 if there is none (closed already); module.c's
 * monitor_close(id) then drops its reference on the hooks. */
int ap_monitor_close(int64_t id);
/* Module functions: monitor_observers(id) -> the observer list (mutable);
 * monitor_read(id) -> dict. */
PyObject *ap_monitor_observers(PyObject *module, PyObject *id);
PyObject *ap_monitor_read(PyObject *module, PyObject *id);

#endif
