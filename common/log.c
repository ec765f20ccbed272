#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static bt_log_level_t g_level = BT_LOG_INFO;
static char g_tag[32] = "baton";

void bt_log_set_level(bt_log_level_t level)
{
    g_level = level;
}

bt_log_level_t bt_log_get_level(void)
{
    return g_level;
}

int bt_log_level_parse(const char *s)
{
    static const struct {
        const char *name;
        bt_log_level_t level;
    } names[] = {{"debug", BT_LOG_DEBUG}, {"info", BT_LOG_INFO},   {"warn", BT_LOG_WARN},
                 {"warning", BT_LOG_WARN}, {"error", BT_LOG_ERROR}, {"off", BT_LOG_OFF}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(s, names[i].name) == 0) return (int)names[i].level;
    return -1;
}

void bt_log_set_tag(const char *tag)
{
    snprintf(g_tag, sizeof(g_tag), "%s", tag);
}

void bt_log_write(bt_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    if (level < g_level || level >= BT_LOG_OFF) return;

    char buf[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int n = snprintf(buf, sizeof(buf), "%02d:%02d:%02d.%03ld %-5s %s %s:%d ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, level_names[level], g_tag, base, line);
    if (n < 0) return;
    if ((size_t)n < sizeof(buf)) {
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
        va_end(ap);
        if (m > 0) n += m;
    }
    if ((size_t)n >= sizeof(buf) - 1) n = (int)sizeof(buf) - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}

void bt__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
