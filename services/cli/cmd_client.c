/* baton complete: a gRPC client of the router's public API (baton.v1.Baton/Generate).
 * Streams the text to stderr as it arrives and prints the generated ids, comma-separated,
 * as the last line of stdout (the same form as `baton generate`). */
#include "services/cli/cli.h"

#include "common/alloc.h"
#include "common/flags.h"
#include "common/json.h"
#include "common/log.h"
#include "common/rpc/rpc.h"
#include "services/common/proto_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *ids;
    size_t n, cap;
    bt_rpc_code_t code;
    char message[512];
    char finish[32];
    bool done, quiet;
    int prompt_tokens, completion_tokens, cached_tokens;
    uv_loop_t *loop;
} client_t;

static void on_message(void *ctx, const uint8_t *msg, size_t len)
{
    client_t *c = ctx;
    Baton__V1__GenerateResponse *r = BT_PROTO_UNPACK(baton__v1__generate_response, msg, len);
    if (!r) return;
    for (size_t i = 0; i < r->n_token_ids; i++) {
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 64;
            c->ids = bt_realloc_or_die(c->ids, c->cap * sizeof *c->ids);
        }
        c->ids[c->n++] = r->token_ids[i];
    }
    if (!c->quiet) {
        if (r->reasoning_text && *r->reasoning_text) fprintf(stderr, "%s", r->reasoning_text);
        if (r->text && *r->text) fprintf(stderr, "%s", r->text);
        for (size_t i = 0; i < r->n_tool_calls; i++)
            fprintf(stderr, "\n[tool call %s: %s(%s)]\n", r->tool_calls[i]->id, r->tool_calls[i]->name,
                    r->tool_calls[i]->arguments);
    }
    if (r->finish_reason != BATON__V1__FINISH_REASON__FINISH_NONE) {
        const ProtobufCEnumValue *v =
            protobuf_c_enum_descriptor_get_value(&baton__v1__finish_reason__descriptor, r->finish_reason);
        snprintf(c->finish, sizeof c->finish, "%s", v ? v->name : "?");
        if (r->usage) {
            c->prompt_tokens = r->usage->prompt_tokens;
            c->completion_tokens = r->usage->completion_tokens;
            c->cached_tokens = r->usage->cached_tokens;
        }
    }
    BT_PROTO_FREE(baton__v1__generate_response, r);
}

static void on_done(void *ctx, bt_rpc_code_t code, const char *message)
{
    client_t *c = ctx;
    c->code = code;
    snprintf(c->message, sizeof c->message, "%s", message ? message : "");
    c->done = true;
    uv_stop(c->loop);
}

int bt_cli_complete(int argc, char **argv)
{
    const char *router = "127.0.0.1:50051", *ids_arg = NULL, *prompt = NULL, *chat = NULL;
    const char *model = NULL, *stops = NULL, *json_schema = NULL, *regex = NULL;
    int64_t max_new = 16, seed = -1, top_k = 0, timeout_s = 600;
    double temperature = 0.0, top_p = 1.0, min_p = 0.0;
    bool ignore_eos = false, quiet = false, json_object = false;
    bt_flag_t spec[] = {
        BT_FLAG_STR("router", &router, "router address (default 127.0.0.1:50051)"),
        BT_FLAG_STR("input-ids", &ids_arg, "comma-separated prompt token ids"),
        BT_FLAG_STR("prompt", &prompt, "prompt text (tokenized as is)"),
        BT_FLAG_STR("chat-json", &chat, "an OpenAI chat request JSON (messages, tools, ...)"),
        BT_FLAG_STR("model", &model, "model name (default: the served one)"),
        BT_FLAG_INT("max-new-tokens", &max_new, "tokens to generate (default 16)"),
        BT_FLAG_FLOAT("temperature", &temperature, "0 = greedy (default)"),
        BT_FLAG_FLOAT("top-p", &top_p, "nucleus mass"),
        BT_FLAG_INT("top-k", &top_k, "keep the k most likely"),
        BT_FLAG_FLOAT("min-p", &min_p, "min-p filter"),
        BT_FLAG_INT("seed", &seed, "sampling seed"),
        BT_FLAG_STR("stop", &stops, "a stop string"),
        BT_FLAG_BOOL("ignore-eos", &ignore_eos, "keep generating past the end-of-sequence token"),
        BT_FLAG_BOOL("json-object", &json_object, "constrained: the answer is a JSON object"),
        BT_FLAG_STR("json-schema", &json_schema, "constrained: an instance of this JSON schema"),
        BT_FLAG_STR("regex", &regex, "constrained: the whole answer matches this pattern"),
        BT_FLAG_BOOL("quiet", &quiet, "do not echo the text"),
        BT_FLAG_INT("timeout", &timeout_s, "deadline in seconds (default 600)"),
    };
    char err[256];
    bt_status_t st = bt_flags_parse(spec, BT_COUNTOF(spec), argc, argv, NULL, err, sizeof err);
    if (st == BT_ERR_NOT_FOUND) return 0;
    if (st != BT_OK) {
        fprintf(stderr, "baton complete: %s\n", err);
        return 2;
    }
    if (!!ids_arg + !!prompt + !!chat != 1) {
        fprintf(stderr, "baton complete: give exactly one of --input-ids, --prompt, --chat-json\n");
        return 2;
    }
    if (json_object + !!json_schema + !!regex > 1) {
        fprintf(stderr,
                "baton complete: give at most one of --json-object, --json-schema, --regex\n");
        return 2;
    }
    Baton__V1__GenerateRequest g = BATON__V1__GENERATE_REQUEST__INIT;
    Baton__V1__TokenIds tids = BATON__V1__TOKEN_IDS__INIT;
    Baton__V1__SamplingParams sp = BATON__V1__SAMPLING_PARAMS__INIT;
    int32_t *ids = NULL;
    if (ids_arg) {
        int n;
        if (bt_flags_parse_int_list(ids_arg, &ids, &n, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton complete: --input-ids: %s\n", err);
            return 2;
        }
        tids.n_ids = (size_t)n;
        tids.ids = ids;
        g.prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
        g.token_ids = &tids;
    } else if (prompt) {
        g.prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_TEXT;
        g.text = (char *)prompt;
    } else {
        g.prompt_case = BATON__V1__GENERATE_REQUEST__PROMPT_CHAT_JSON;
        g.chat_json = (char *)chat;
    }
    if (model) g.model = (char *)model;
    sp.temperature = (float)temperature;
    sp.top_p = (float)top_p;
    sp.top_k = (int32_t)top_k;
    sp.min_p = (float)min_p;
    sp.max_tokens = (int32_t)max_new;
    sp.ignore_eos = ignore_eos;
    if (seed >= 0) {
        sp.has_seed = 1;
        sp.seed = (uint64_t)seed;
    }
    char *stop_arr[1] = {(char *)stops};
    if (stops) {
        sp.n_stop = 1;
        sp.stop = stop_arr;
    }
    /* (the router checks the constraint and names what it cannot hold the answer to) */
    if (json_object) sp.response_format = "json_object";
    if (json_schema || regex) {
        sp.response_format = json_schema ? "json_schema" : "regex";
        sp.json_schema = (char *)(json_schema ? json_schema : regex);
    }
    g.sampling = &sp;
    g.skip_special_tokens = 1;
    uint8_t *buf;
    size_t len;
    bt_proto_pack(&g.base, &buf, &len);
    free(ids);

    client_t c = {0};
    c.quiet = quiet;
    c.loop = uv_default_loop();
    bt_rpc_t *rpc = NULL;
    bt_rpc_channel_t *ch = NULL;
    int rc = 1;
    if (bt_rpc_create(c.loop, &rpc) != BT_OK || bt_rpc_channel_create(rpc, router, NULL, &ch) != BT_OK ||
        bt_rpc_stream(ch, "/baton.v1.Baton/Generate", buf, len, timeout_s * 1000, on_message, on_done, &c,
                      NULL) != BT_OK) {
        fprintf(stderr, "baton complete: cannot call %s\n", router);
        free(buf);
        return 1;
    }
    free(buf);
    while (!c.done) uv_run(c.loop, UV_RUN_DEFAULT);
    if (!quiet) fprintf(stderr, "\n");
    if (c.code != BT_RPC_OK) {
        fprintf(stderr, "baton complete: %s: %s\n", bt_rpc_code_name(c.code), c.message);
        rc = c.code == BT_RPC_RESOURCE_EXHAUSTED ? 3 : 1;
    } else {
        fprintf(stderr, "finish: %s; usage: %d prompt (%d cached) + %d completion tokens\n",
                c.finish, c.prompt_tokens, c.cached_tokens, c.completion_tokens);
        for (size_t i = 0; i < c.n; i++) printf(i ? ",%d" : "%d", c.ids[i]);
        printf("\n");
        rc = 0;
    }
    bt_rpc_channel_destroy(ch);
    /* let the channel wind down before the rpc instance goes */
    uv_run(c.loop, UV_RUN_NOWAIT);
    bt_rpc_destroy(rpc);
    free(c.ids);
    return rc;
}
