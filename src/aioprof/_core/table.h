/* table.h - a pointer-keyed hash table (open addressing, linear probing).
 *
 * Keys are non-zero uintptr_t (object addresses or 64-bit mixes), values uintptr_t.
 * No Python.h: memory comes from malloc, so the table can be used from any hook. */
#ifndef AP_TABLE_H
#define AP_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uintptr_t *keys;   /* 0 = empty slot */
    uintptr_t *vals;
    size_t cap;        /* a power of two, or 0 before the first insert */
    size_t len;
} ap_table_t;

/* Free the arrays and reset to empty. */
void ap_table_free(ap_table_t *t);
/* Value for key, or 0 if absent. */
uintptr_t ap_table_get(const ap_table_t *t, uintptr_t key);
/* Insert or replace; returns 0, or -1 when out of memory (table unchanged). */
int ap_table_put(ap_table_t *t, uintptr_t key, uintptr_t val);
/* Remove key if present; returns 1 if it was there, else 0. */
int ap_table_del(ap_table_t *t, uintptr_t key);
/* A 64-bit mix of two words, never 0: for composite keys such as (code, line). */
uintptr_t ap_mix2(uintptr_t a, uintptr_t b);
/* A key for a sequence of n indices (await chains, stacks); salt tells kinds apart. */
uintptr_t ap_seq_hash(const uint32_t *v, uint32_t n, uintptr_t salt);

#endif
