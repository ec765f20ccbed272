/* DeepSeek-V4.1 chat encoding against the reference encoder's prompts
 * (tests/data/chat_encoding/cases.json, see its README) and request validation. */
#include "bt_test.h"

#include "common/json.h"
#include "common/text/chat.h"
#include "common/text/tokenizer.h"

#include <string.h>

static bt_tokenizer_t *tok;

static void show_diff(const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  first difference at byte %zu\n  want: ...%.80s\n  got:  ...%.80s\n", i,
            want + from, got + from);
}

static void test_reference_table(void)
{
    char *data;
    size_t len;
    char err[512];
    BT_CHECK(bt_read_file(BT_TEST_DATA_DIR "/chat_encoding/cases.json", 1 << 24, &data, &len, err,
                          sizeof err) == BT_OK);
    cJSON *root = bt_chat_parse_request(data, len);
    BT_CHECK(root != NULL);
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root)
    {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *want = cJSON_GetObjectItem(c, "prompt")->valuestring;
        const cJSON *req = cJSON_GetObjectItem(c, "request");
        char *got = NULL;
        size_t gl;
        bt_status_t st = bt_chat_render(req, &got, &gl, err, sizeof err);
        BT_CHECK_MSG(st == BT_OK, "%s: %s", name, err);
        if (st == BT_OK) {
            bool same = gl == strlen(want) && !memcmp(got, want, gl);
            BT_CHECK_MSG(same, "case %s", name);
            if (!same) show_diff(want, got);
        }
        if (tok && st == BT_OK) {
            int32_t *a, *b;
            size_t na, nb;
            BT_CHECK(bt_chat_encode(tok, req, &a, &na, err, sizeof err) == BT_OK);
            BT_CHECK(bt_tokenizer_encode(tok, want, strlen(want), 0, &b, &nb) == BT_OK);
            BT_CHECK(na == nb && !memcmp(a, b, na * sizeof *a));
            BT_CHECK(na > 0 && a[0] == bt_tokenizer_bos_id(tok));
            free(a);
            free(b);
        }
        free(got);
        n++;
    }
    BT_CHECK(n >= 15);
    cJSON_Delete(root);
    free(data);
}

static void expect_bad(const char *json, const char *field)
{
    cJSON *req = bt_chat_parse_request(json, strlen(json));
    char err[512] = "";
    char *p = NULL;
    size_t l;
    bt_status_t st = req ? bt_chat_render(req, &p, &l, err, sizeof err) : BT_ERR_BAD_REQUEST;
    BT_CHECK_MSG(st == BT_ERR_BAD_REQUEST, "%s accepted", json);
    BT_CHECK_MSG(!field || strstr(err, field), "message '%s' should name %s", err, field);
    free(p);
    cJSON_Delete(req);
}

static void test_bad_requests(void)
{
    expect_bad("{}", "messages");
    expect_bad("{\"messages\": []}", "messages");
    expect_bad("{\"messages\": [{\"content\": \"x\"}]}", "messages[0].role");
    expect_bad("{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "role");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"a<｜deepseek_image｜>\"}]}", "content");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": \"medium\"}",
               "reasoning_effort");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": 0}",
               "reasoning_effort");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"reasoning_effort\": 50.5}",
               "reasoning_effort");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": "
               "{\"thinking\": \"yes\"}}",
               "thinking");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": "
               "\"function\"}]}",
               "tools[0].function");
    expect_bad("{\"messages\": [{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {}}]}]}",
               "tool_calls[0]");
    expect_bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": 3}", "tools");
}

/* OpenAI's "developer" role renders as "system" does, first (where tools go after it) or
 * later in the conversation; it was refused (a 400 to OpenAI's SDKs, which send it). */
static void test_developer_is_system(void)
{
    const char *const pairs[][2] = {
        {"{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, {\"role\": "
         "\"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": "
         "{\"name\": \"f\"}}]}",
         "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
         "\"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\", \"function\": "
         "{\"name\": \"f\"}}]}"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
         "\"content\": \"yes\"}, {\"role\": \"developer\", \"content\": \"Now in French.\"}]}",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
         "\"content\": \"yes\"}, {\"role\": \"system\", \"content\": \"Now in French.\"}]}"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char *p[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            cJSON *req = bt_chat_parse_request(pairs[i][k], strlen(pairs[i][k]));
            size_t l;
            char err[256] = "";
            BT_CHECK_MSG(req && bt_chat_render(req, &p[k], &l, err, sizeof err) == BT_OK,
                         "case %zu/%d: %s", i, k, err);
            cJSON_Delete(req);
        }
        BT_CHECK_MSG(p[0] && p[1] && !strcmp(p[0], p[1]), "case %zu: developer '%s', system '%s'",
                     i, p[0] ? p[0] : "?", p[1] ? p[1] : "?");
        BT_CHECK_MSG(p[1] && strstr(p[1], i == 0 ? "Be brief." : "Now in French."), "case %zu", i);
        free(p[0]);
        free(p[1]);
    }
}

static void test_number_spelling(void)
{
    /* a tree from plain cJSON_Parse still renders; integral numbers print as integers */
    const char *json = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                       "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"a\": 2, \"b\": "
                       "0.1, \"c\": 1.0}}]}";
    cJSON *plain = cJSON_Parse(json);
    cJSON *kept = bt_chat_parse_request(json, strlen(json));
    char *p1, *p2;
    size_t l;
    char err[256];
    BT_CHECK(bt_chat_render(plain, &p1, &l, err, sizeof err) == BT_OK);
    BT_CHECK(bt_chat_render(kept, &p2, &l, err, sizeof err) == BT_OK);
    BT_CHECK(strstr(p1, "{\"name\": \"f\", \"a\": 2, \"b\": 0.1, \"c\": 1}") != NULL);
    BT_CHECK(strstr(p2, "{\"name\": \"f\", \"a\": 2, \"b\": 0.1, \"c\": 1.0}") != NULL);
    free(p1);
    free(p2);
    cJSON_Delete(plain);
    cJSON_Delete(kept);
}

/* bt_chat_thinking (the reasoning parser's switch, in the router) says thinking exactly when
 * the rendered prompt ends in <think>, however the request asks for it */
static void test_thinking_rule(void)
{
    static const struct {
        const char *extra;
        bool want;
    } cases[] = {
        {"", false},
        {",\"chat_template_kwargs\":{\"thinking\":true}", true},
        {",\"chat_template_kwargs\":{\"thinking\":1}", true},
        {",\"chat_template_kwargs\":{\"thinking\":0}", false},
        {",\"chat_template_kwargs\":{\"thinking\":null,\"enable_thinking\":true}", true},
        {",\"chat_template_kwargs\":{\"enable_thinking\":true}", true},
        {",\"enable_thinking\":true", true},
        {",\"chat_template_kwargs\":{\"thinking\":false},\"enable_thinking\":true", false},
        {",\"chat_template_kwargs\":null,\"enable_thinking\":true", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s}",
                 cases[i].extra);
        cJSON *req = bt_chat_parse_request(json, strlen(json));
        char *p = NULL, err[256] = "";
        size_t l = 0;
        bool thinking = !cases[i].want;
        BT_CHECK_MSG(req && bt_chat_render(req, &p, &l, err, sizeof err) == BT_OK, "%s: %s", json,
                     err);
        BT_CHECK(req && bt_chat_thinking(req, &thinking, err, sizeof err) == BT_OK);
        const bool ends = p && l >= 7 && !strcmp(p + l - 7, "<think>");
        BT_CHECK_MSG(thinking == cases[i].want && ends == cases[i].want,
                     "%s: thinking %d, prompt ends in <think> %d, want %d", json, thinking, ends,
                     cases[i].want);
        free(p);
        cJSON_Delete(req);
    }
}

int main(void)
{
    char err[256];
    if (bt_tokenizer_load(BT_GOLDEN_DIR "/tokenizer", &tok, err, sizeof err) != BT_OK) {
        fprintf(stderr, "tokenizer: %s\n", err);
        tok = NULL;
    }
    BT_RUN(test_reference_table);
    BT_RUN(test_bad_requests);
    BT_RUN(test_number_spelling);
    BT_RUN(test_developer_is_system);
    BT_RUN(test_thinking_rule);
    bt_tokenizer_destroy(tok);
    return bt_test_summary();
}
