/* Allocation helpers. Out of memory on these paths is a broken invariant for the CLI and
 * a status for services, so two flavours exist:
 *
 *   float *x = bt_malloc_or_die(n * sizeof *x);     // tools, tests, startup
 *   float *y = bt_aligned_alloc(64, bytes);         // may return NULL; free with bt_aligned_free
 *
 * bt_mul_overflows() guards size arithmetic on untrusted shapes. */
#ifndef BT_ALLOC_H
#define BT_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *bt_malloc_or_die(size_t n);
void *bt_calloc_or_die(size_t n, size_t size);
void *bt_realloc_or_die(void *p, size_t n);
char *bt_strdup_or_die(const char *s);

/* 64-byte (or `align`) aligned, zero-filled; NULL on failure. */
void *bt_aligned_alloc(size_t align, size_t n);
void bt_aligned_free(void *p);

/* 1 when a*b overflows size_t (result untouched), else 0 and *out_p = a*b. */
static inline int bt_mul_overflows(size_t a, size_t b, size_t *out_p)
{
    if (a != 0 && b > SIZE_MAX / a) return 1;
    *out_p = a * b;
    return 0;
}

#endif
