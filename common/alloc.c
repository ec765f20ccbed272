#include "common/alloc.h"

#include "common/log.h"

#include <stdlib.h>
#include <string.h>

static void die_oom(size_t n)
{
    BT_LOG_ERROR("out of memory allocating %zu bytes", n);
    abort();
}

void *bt_malloc_or_die(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die_oom(n);
    return p;
}

void *bt_calloc_or_die(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die_oom(n * size);
    return p;
}

void *bt_realloc_or_die(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) die_oom(n);
    return q;
}

char *bt_strdup_or_die(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = bt_malloc_or_die(n);
    memcpy(p, s, n);
    return p;
}

void *bt_aligned_alloc(size_t align, size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : align) != 0) return NULL;
    memset(p, 0, n);
    return p;
}

void bt_aligned_free(void *p)
{
    free(p);
}
