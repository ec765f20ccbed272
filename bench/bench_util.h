/* What every CPU benchmark here needs: a monotonic clock in seconds and the comparison that
 * sorts samples for a median. */
#ifndef BT_BENCH_UTIL_H
#define BT_BENCH_UTIL_H

#include <time.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
