#include "bt_test.h"

#include "common/flags.h"
#include "common/status.h"

#include <string.h>

static void test_parse_forms(void)
{
    const char *model = NULL;
    int64_t port = 1;
    double frac = 0.0;
    bool verbose = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("model-path", &model, "m"),
        BT_FLAG_INT("port", &port, "p"),
        BT_FLAG_FLOAT("mem-fraction-static", &frac, "f"),
        BT_FLAG_BOOL("verbose", &verbose, "v"),
    };
    char *argv[] = {"--model-path", "/m", "--port=9000", "--mem-fraction-static", "0.5",
                    "--verbose"};
    char err[128] = "";
    BT_CHECK(bt_flags_parse(spec, BT_COUNTOF(spec), 6, argv, NULL, err, sizeof err) == BT_OK);
    BT_CHECK(model && !strcmp(model, "/m"));
    BT_CHECK_EQ_INT(port, 9000);
    BT_CHECK(frac == 0.5);
    BT_CHECK(verbose);
}

static void test_unknown_flag_is_named(void)
{
    int64_t port = 0;
    bt_flag_t spec[] = {BT_FLAG_INT("port", &port, "p")};
    char *argv[] = {"--prot", "1"};
    char err[128] = "";
    BT_CHECK(bt_flags_parse(spec, 1, 2, argv, NULL, err, sizeof err) == BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(err, "--prot") != NULL);
}

static void test_bad_values(void)
{
    int64_t port = 0;
    bt_flag_t spec[] = {BT_FLAG_INT("port", &port, "p")};
    char *a1[] = {"--port", "12x"};
    char *a2[] = {"--port"};
    char err[128] = "";
    BT_CHECK(bt_flags_parse(spec, 1, 2, a1, NULL, err, sizeof err) == BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(err, "--port") != NULL);
    BT_CHECK(bt_flags_parse(spec, 1, 1, a2, NULL, err, sizeof err) == BT_ERR_INVALID_ARG);
}

static void test_int_list(void)
{
    int32_t *v = NULL;
    int n = 0;
    char err[128];
    BT_CHECK(bt_flags_parse_int_list("1, 2,3", &v, &n, err, sizeof err) == BT_OK);
    BT_CHECK_EQ_INT(n, 3);
    BT_CHECK(v && v[0] == 1 && v[2] == 3);
    free(v);
    BT_CHECK(bt_flags_parse_int_list("1,,2", &v, &n, err, sizeof err) != BT_OK);
    BT_CHECK(bt_flags_parse_int_list("", &v, &n, err, sizeof err) == BT_OK && n == 0);
    free(v);
}

static void test_status_strings(void)
{
    BT_CHECK(!strcmp(bt_status_str(BT_OK), "ok"));
    BT_CHECK(!strcmp(bt_status_name(BT_ERR_IO), "BT_ERR_IO"));
    BT_CHECK(!strcmp(bt_status_str((bt_status_t)12345), "unknown status"));
}

int main(void)
{
    BT_RUN(test_parse_forms);
    BT_RUN(test_unknown_flag_is_named);
    BT_RUN(test_bad_values);
    BT_RUN(test_int_list);
    BT_RUN(test_status_strings);
    return bt_test_summary();
}
