/* OpenAI request mapping for the gateway: a /v1/chat/completions or /v1/completions body
 * (JSON) validated field by field and turned into the router's GenerateRequest. Pure: no
 * I/O, so it is fuzzed on its own.
 *
 *   bt_openai_request_t r;
 *   bt_openai_error_t e;
 *   if (bt_openai_parse(BT_OPENAI_CHAT, body, len, &r, &e) != BT_OK)
 *       -> 400 {"error": {"message": e.message, "type": "invalid_request_error", "param": e.param}}
 *   ... r.gens[i] is prompt i's packed GenerateRequest (r.gen_lens[i]), r.stream, r.include_usage
 * ... bt_openai_request_free(&r);
 */
#ifndef BT_GATEWAY_OPENAI_H
#define BT_GATEWAY_OPENAI_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { BT_OPENAI_CHAT, BT_OPENAI_COMPLETION } bt_openai_kind_t;

typedef struct {
    char message[512];
    char param[64]; /* the offending field, "" when none */
} bt_openai_error_t;

typedef struct {
    bt_openai_kind_t kind;
    char model[256];       /* as asked ("" = the served model) */
    bool stream, include_usage, logprobs;
    int top_logprobs;
    bool echo_prompt;      /* completions: never (refused) */
    bool return_token_ids; /* SGLang's extension: "token_ids" in each streamed choice */
    int n;                 /* choices a prompt: as many generations */
    int n_prompts;         /* completions: a batch of prompts (1: one prompt) */
    uint8_t **gens;        /* each prompt's packed baton.v1.GenerateRequest (n_prompts) */
    size_t *gen_lens;
} bt_openai_request_t;

/* Validates body and builds the GenerateRequest. request_id is copied into it.
 * BT_ERR_BAD_REQUEST with e filled on any problem. */
bt_status_t bt_openai_parse(bt_openai_kind_t kind, const char *body, size_t len,
                            const char *request_id, bt_openai_request_t *r, bt_openai_error_t *e);
void bt_openai_request_free(bt_openai_request_t *r);

/* The most choices (`n` times the prompts) one request may ask for: each is a generation of
 * its own. */
#define BT_OPENAI_MAX_N 64

/* The GenerateRequest of choice `index` of r (0..n x n_prompts - 1: prompt index / n, choice
 * index % n, as OpenAI orders them), under request_id: its seed, when the request gave one, is
 * seed + choice (choices differ, and each is reproducible alone). */
bt_status_t bt_openai_choice_request(const bt_openai_request_t *r, int index,
                                     const char *request_id, uint8_t **buf, size_t *len);

/* {"error": {"message", "type", "param", "code"}} for an HTTP status; caller frees. */
char *bt_openai_error_json(int status, const char *message, const char *param);

#endif
