/* Levelled logging to stderr.
 *
 *   bt_log_set_level(BT_LOG_DEBUG);
 *   BT_LOG_INFO("listening on %s", addr);
 *   BT_ASSERT(n <= cap);              // broken invariant: file:line, abort
 *
 * The level is one of the few globals (STYLE.md). Messages carry a timestamp, the level and
 * the process tag set with bt_log_set_tag(). Thread-safe: one write(2) per line. */
#ifndef BT_LOG_H
#define BT_LOG_H

#include <stdarg.h>

typedef enum { BT_LOG_DEBUG = 0, BT_LOG_INFO, BT_LOG_WARN, BT_LOG_ERROR, BT_LOG_OFF } bt_log_level_t;

void bt_log_set_level(bt_log_level_t level);
bt_log_level_t bt_log_get_level(void);
/* Parses "debug", "info", "warn"/"warning", "error", "off"; returns -1 when unknown. */
int bt_log_level_parse(const char *s);
/* Short tag printed on every line, e.g. "router"; copied. */
void bt_log_set_tag(const char *tag);

void bt_log_write(bt_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define BT_LOG_DEBUG(...) bt_log_write(BT_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define BT_LOG_INFO(...) bt_log_write(BT_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define BT_LOG_WARN(...) bt_log_write(BT_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define BT_LOG_ERROR(...) bt_log_write(BT_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

void bt__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#define BT_ASSERT(expr) ((expr) ? (void)0 : bt__assert_fail(#expr, __FILE__, __LINE__))

#endif
