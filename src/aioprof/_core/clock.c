/* clock.c - see clock.h. */
#define _POSIX_C_SOURCE 200809L
#include "clock.h"

#include <time.h>

/* The fake clock is process-wide on purpose: tests drive every thread from one
 * timeline. Only touched with the GIL held. */
static int fake_on;
static ap_ns_t fake_wall, fake_cpu;

static ap_ns_t read_clock(clockid_t id)
{
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0)
        return 0;
    return (ap_ns_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

ap_ns_t ap_clock_wall(void)
{
    if (__builtin_expect(fake_on, 0))
        return fake_wall;
    return read_clock(CLOCK_MONOTONIC);
}

ap_ns_t ap_clock_cpu(void)
{
    if (__builtin_expect(fake_on, 0))
        return fake_cpu;
    return read_clock(CLOCK_THREAD_CPUTIME_ID);
}

void ap_clock_set_fake(int on)
{
    fake_on = on;
    fake_wall = 0;
    fake_cpu = 0;
}

int ap_clock_is_fake(void) { return fake_on; }

void ap_clock_advance(ap_ns_t wall_ns, ap_ns_t cpu_ns)
{
    fake_wall += wall_ns;
    fake_cpu += cpu_ns;
}
