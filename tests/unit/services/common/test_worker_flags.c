/* The flags every worker (prefill, decode) shares: bt_worker_flags_check's bounds. */
#include "bt_test.h"
#include "services/common/worker_flags.h"

static bool ok_with_watchdog(double s)
{
    bt_worker_flags_t w = bt_worker_flags_default();
    w.watchdog_s = s;
    char err[256] = "";
    return bt_worker_flags_check(&w, false, err, sizeof err);
}

/* --watchdog-timeout under a millisecond became 0 ms: no deadline on a Prefill call, no
 * quarantine for late writes; past ~24.8 days the milliseconds overflowed the int the TP
 * group's sockets take. Both were accepted. */
static void test_watchdog_bounds(void)
{
    BT_CHECK(ok_with_watchdog(300));
    BT_CHECK(ok_with_watchdog(0.001));
    BT_CHECK(ok_with_watchdog(2e6));
    BT_CHECK(!ok_with_watchdog(0));
    BT_CHECK(!ok_with_watchdog(-1));
    BT_CHECK(!ok_with_watchdog(0.0001));
    BT_CHECK(!ok_with_watchdog(3e6));
    BT_CHECK(!ok_with_watchdog(NAN));
}

static void test_defaults_pass(void)
{
    bt_worker_flags_t w = bt_worker_flags_default();
    char err[256] = "";
    BT_CHECK_MSG(bt_worker_flags_check(&w, false, err, sizeof err), "%s", err);
    w.tp = 2; /* needs --dist-init-addr */
    BT_CHECK(!bt_worker_flags_check(&w, false, err, sizeof err));
    BT_CHECK(strstr(err, "--dist-init-addr") != NULL);
}

int main(void)
{
    BT_RUN(test_defaults_pass);
    BT_RUN(test_watchdog_bounds);
    return bt_test_summary();
}
