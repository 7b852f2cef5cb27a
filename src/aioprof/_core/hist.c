/* hist.c - see hist.h. */
#include "hist.h"

#include <stdlib.h>

int ap_hist_index(int64_t ns)
{
    if (ns < 8)
        return ns < 0 ? 0 : (int)ns;
    int e = 63 - __builtin_clzll((unsigned long long)ns);   /* e >= 3 */
    int sub = (int)((ns >> (e - 3)) & 7);
    return (e - 2) * 8 + sub;
}

int64_t ap_hist_lower(int idx)
{
    if (idx < 8)
        return idx;
    int e = idx / 8 + 2, sub = idx % 8;
    return ((int64_t)(8 + sub)) << (e - 3);
}

int ap_hist_add(ap_hist_t *h, int64_t ns)
{
    if (ns < 0)
        ns = 0;
    if (!h->b && !(h->b = calloc(AP_HIST_BUCKETS, sizeof *h->b)))
        return -1;
    h->b[ap_hist_index(ns)]++;
    h->count++;
    h->sum += ns;
    if (ns > h->max)
        h->max = ns;
    return 0;
}

int64_t ap_hist_quantile(const ap_hist_t *h, double q)
{
    if (!h->b || h->count == 0)
        return 0;
    if (q >= 1.0)
        return h->max;
    uint64_t rank = (uint64_t)(q * (double)h->count);
    if (rank >= h->count)
        rank = h->count - 1;
    uint64_t seen = 0;
    for (int i = 0; i < AP_HIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen > rank) {
            int64_t lo = ap_hist_lower(i), hi = ap_hist_lower(i + 1);
            int64_t mid = i < 8 ? lo : lo + (hi - lo) / 2;
            return mid > h->max ? h->max : mid;
        }
    }
    return h->max;
}

int ap_hist_merge(ap_hist_t *dst, const ap_hist_t *src)
{
    if (!src->b)
        return 0;
    if (!dst->b && !(dst->b = calloc(AP_HIST_BUCKETS, sizeof *dst->b)))
        return -1;
    for (int i = 0; i < AP_HIST_BUCKETS; i++)
        dst->b[i] += src->b[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->max > dst->max)
        dst->max = src->max;
    return 0;
}

void ap_hist_free(ap_hist_t *h)
{
    free(h->b);
    h->b = NULL;
    h->count = 0;
    h->max = 0;
    h->sum = 0;
}
