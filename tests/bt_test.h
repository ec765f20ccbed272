/* A minimal test harness: checks record failures and go on; main returns non-zero when any
 * check failed. Each test executable is one CTest test.
 *
 *   static void test_parse(void) { BT_CHECK(parse("1") == 1); BT_CHECK_EQ_INT(a, b); }
 *   int main(void) { BT_RUN(test_parse); return bt_test_summary(); }
 */
#ifndef BT_TEST_H
#define BT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bt_test_failures;
static int bt_test_checks;
static const char *bt_test_current = "";

#define BT_CHECK(cond)                                                                             \
    do {                                                                                           \
        bt_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            bt_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: [%s] check failed: %s\n", __FILE__, __LINE__,                  \
                    bt_test_current, #cond);                                                       \
        }                                                                                          \
    } while (0)

#define BT_CHECK_MSG(cond, ...)                                                                    \
    do {                                                                                           \
        bt_test_checks++;                                                                          \
        if (!(cond)) {                                                                             \
            bt_test_failures++;                                                                    \
            fprintf(stderr, "%s:%d: [%s] check failed: %s: ", __FILE__, __LINE__,                  \
                    bt_test_current, #cond);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define BT_CHECK_EQ_INT(a, b)                                                                      \
    BT_CHECK_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

/* BT_TEST_ONLY=name runs only that test (and says so), for working on one case. */
#define BT_RUN(fn)                                                                                 \
    do {                                                                                           \
        const char *only_ = getenv("BT_TEST_ONLY");                                                \
        if (only_ && *only_ && strcmp(only_, #fn) != 0) break;                                     \
        int before_ = bt_test_failures;                                                            \
        bt_test_current = #fn;                                                                     \
        fn();                                                                                      \
        fprintf(stderr, "%s %s\n", bt_test_failures == before_ ? "ok  " : "FAIL", #fn);            \
    } while (0)

static inline int bt_test_summary(void)
{
    fprintf(stderr, "%d checks, %d failed\n", bt_test_checks, bt_test_failures);
    return bt_test_failures ? 1 : 0;
}

#endif
