/* clock.h - the one way aioprof reads time.
 *
 * Wall time is CLOCK_MONOTONIC (the clock of time.monotonic() and so of
 * asyncio's loop.time()); CPU time is the calling thread's CLOCK_THREAD_CPUTIME_ID.
 * Both in integer nanoseconds. Tests switch both to a fake clock that only moves
 * when told to, so figures can be asserted exactly. */
#ifndef AP_CLOCK_H
#define AP_CLOCK_H

#include <stdint.h>

typedef int64_t ap_ns_t;

/* Wall time now, in ns. Never fails. */
ap_ns_t ap_clock_wall(void);
/* CPU time of the calling thread, in ns (a system call, ~0.5 us: read sparingly). */
ap_ns_t ap_clock_cpu(void);
/* Switch the fake clock on (1) or off (0); switching on resets it to 0/0. */
void ap_clock_set_fake(int on);
int ap_clock_is_fake(void);
/* Move the fake clock forward by wall_ns and cpu_ns (both >= 0). */
void ap_clock_advance(ap_ns_t wall_ns, ap_ns_t cpu_ns);

#endif
