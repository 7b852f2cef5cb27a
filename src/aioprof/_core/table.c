/* table.c - see table.h. Deletion uses backward shifting, so there are no
 * tombstones and lookups stay short however many tasks come and go. */
#include "table.h"

#include <stdlib.h>

static inline size_t slot_of(uintptr_t key, size_t cap)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 29)) & (cap - 1);
}

uintptr_t ap_mix2(uintptr_t a, uintptr_t b)
{
    uint64_t h = (uint64_t)a * 0xBF58476D1CE4E5B9ull ^ ((uint64_t)b + 0x9E3779B97F4A7C15ull);
    h ^= h >> 31;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    return h ? (uintptr_t)h : 1;
}

uintptr_t ap_seq_hash(const uint32_t *v, uint32_t n, uintptr_t salt)
{
    uintptr_t key = ap_mix2(n, salt);
    for (uint32_t i = 0; i < n; i++)
        key = ap_mix2(key, v[i]);
    return key;
}

void ap_table_free(ap_table_t *t)
{
    free(t->keys);
    free(t->vals);
    t->keys = t->vals = NULL;
    t->cap = t->len = 0;
}

uintptr_t ap_table_get(const ap_table_t *t, uintptr_t key)
{
    if (t->cap == 0)
        return 0;
    for (size_t i = slot_of(key, t->cap);; i = (i + 1) & (t->cap - 1)) {
        if (t->keys[i] == key)
            return t->vals[i];
        if (t->keys[i] == 0)
            return 0;
    }
}

static int grow(ap_table_t *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 64;
    uintptr_t *nk = calloc(ncap, sizeof *nk), *nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
        free(nk);
        free(nv);
        return -1;
    }
    for (size_t j = 0; j < t->cap; j++) {
        if (t->keys[j] == 0)
            continue;
        size_t i = slot_of(t->keys[j], ncap);
        while (nk[i])
            i = (i + 1) & (ncap - 1);
        nk[i] = t->keys[j];
        nv[i] = t->vals[j];
    }
    free(t->keys);
    free(t->vals);
    t->keys = nk;
    t->vals = nv;
    t->cap = ncap;
    return 0;
}

int ap_table_put(ap_table_t *t, uintptr_t key, uintptr_t val)
{
    if ((t->len + 1) * 4 > t->cap * 3 && grow(t) < 0)
        return -1;
    size_t i = slot_of(key, t->cap);
    while (t->keys[i] && t->keys[i] != key)
        i = (i + 1) & (t->cap - 1);
    if (t->keys[i] == 0)
        t->len++;
    t->keys[i] = key;
    t->vals[i] = val;
    return 0;
}

int ap_table_del(ap_table_t *t, uintptr_t key)
{
    if (t->cap == 0)
        return 0;
    size_t mask = t->cap - 1, i = slot_of(key, t->cap);
    while (t->keys[i] != key) {
        if (t->keys[i] == 0)
            return 0;
        i = (i + 1) & mask;
    }
    /* Backward-shift: move later members of the probe run into the hole when
     * their home slot does not lie cyclically between the hole and them. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; t->keys[j]; j = (j + 1) & mask) {
        size_t home = slot_of(t->keys[j], t->cap);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->keys[hole] = t->keys[j];
            t->vals[hole] = t->vals[j];
            hole = j;
        }
    }
    t->keys[hole] = 0;
    t->vals[hole] = 0;
    t->len--;
    return 1;
}
