#include "common/threads.h"

#include "common/alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

struct bt_threads {
    int n_workers; /* helper threads; the caller is one more */
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    uint64_t generation;
    bool stop;
    /* current job */
    bt_threads_fn fn;
    void *ctx;
    size_t n;
    atomic_size_t next;
    int active;
};

static void run_job(bt_threads_t *p)
{
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n) break;
        p->fn(p->ctx, i);
    }
}

static void *worker_main(void *arg)
{
    bt_threads_t *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->start_cv, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_job(p);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

bt_threads_t *bt_threads_create(int n_threads)
{
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    bt_threads_t *p = bt_calloc_or_die(1, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->n_workers = n_threads - 1;
    p->workers = bt_calloc_or_die((size_t)(p->n_workers ? p->n_workers : 1), sizeof(pthread_t));
    for (int i = 0; i < p->n_workers; i++) pthread_create(&p->workers[i], NULL, worker_main, p);
    return p;
}

void bt_threads_destroy(bt_threads_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_workers; i++) pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->start_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int bt_threads_count(const bt_threads_t *p)
{
    return p ? p->n_workers + 1 : 1;
}

void bt_threads_for(bt_threads_t *p, size_t n, bt_threads_fn fn, void *ctx)
{
    if (n == 0) return;
    if (!p || p->n_workers == 0 || n == 1) {
        for (size_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store(&p->next, 0);
    p->active = p->n_workers;
    p->generation++;
    pthread_cond_broadcast(&p->start_cv);
    pthread_mutex_unlock(&p->mu);
    run_job(p);
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
