/* A fixed pool of worker threads running parallel-for loops.
 *
 *   bt_threads_t *pool = bt_threads_create(4);          // 0 = one per online core
 *   bt_threads_for(pool, n_rows, row_fn, &ctx);         // row_fn(ctx, i) for i in [0, n_rows)
 *   bt_threads_destroy(pool);
 *
 * Which thread runs which index is not fixed; kernels keep their results independent of
 * it (every output element is reduced in one fixed order by one thread), so results are
 * bit-identical whatever the thread count. A NULL pool runs the loop inline. */
#ifndef BT_THREADS_H
#define BT_THREADS_H

#include <stddef.h>

typedef struct bt_threads bt_threads_t;
typedef void (*bt_threads_fn)(void *ctx, size_t index);

bt_threads_t *bt_threads_create(int n_threads);
void bt_threads_destroy(bt_threads_t *pool);
int bt_threads_count(const bt_threads_t *pool);
/* Runs fn(ctx, i) for every i < n, the calling thread included; returns when all are done. */
void bt_threads_for(bt_threads_t *pool, size_t n, bt_threads_fn fn, void *ctx);

#endif
