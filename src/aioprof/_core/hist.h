/* hist.h - log-linear histograms of nanosecond durations.
 *
 * 8 sub-buckets per power of two (HdrHistogram-style with 3 significant bits):
 * a value is placed within 12.5% of its true size; values 0..7 ns are exact.
 * Fixed size (AP_HIST_BUCKETS counters), so memory per histogram is constant. */
#ifndef AP_HIST_H
#define AP_HIST_H

#include <stdint.h>

#define AP_HIST_BUCKETS 496

typedef struct {
    uint64_t count;
    int64_t max;
    int64_t sum;   /* of the values counted (ns), for Prometheus' _sum */
    uint32_t *b;   /* AP_HIST_BUCKETS counters, allocated on first add */
} ap_hist_t;

/* Count one value (ns >= 0; negatives count as 0). Returns -1 on out of memory. */
int ap_hist_add(ap_hist_t *h, int64_t ns);
/* The value at quantile q in [0, 1] (the middle of its bucket; the max for q=1), 0 if empty. */
int64_t ap_hist_quantile(const ap_hist_t *h, double q);
/* Add every count of src into dst. Returns -1 on out of memory. */
int ap_hist_merge(ap_hist_t *dst, const ap_hist_t *src);
void ap_hist_free(ap_hist_t *h);
/* Bucket index of a value and the lower bound of a bucket (exposed for tests). */
int ap_hist_index(int64_t ns);
int64_t ap_hist_lower(int idx);

#endif
