/* libFuzzer target: the gateway's OpenAI request mapping (bodies come from the internet). A
 * request that parses gives each of its choices (`n` for each prompt of a batch) a
 * GenerateRequest that unpacks, under its own id, with the seed moved by the choice's index
 * among its prompt's when one was given. */
#include "services/common/proto_util.h"
#include "services/gateway/openai.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_choice(const bt_openai_request_t *r, int index)
{
    Baton__V1__GenerateRequest *base =
        BT_PROTO_UNPACK(baton__v1__generate_request, r->gens[0], r->gen_lens[0]);
    if (!base) abort();
    uint8_t *buf;
    size_t len;
    if (bt_openai_choice_request(r, index, "fuzz-1", &buf, &len) != BT_OK) abort();
    Baton__V1__GenerateRequest *g = BT_PROTO_UNPACK(baton__v1__generate_request, buf, len);
    if (!g || strcmp(g->request_id, "fuzz-1") != 0) abort();
    if (base->sampling && base->sampling->has_seed &&
        g->sampling->seed != base->sampling->seed + (uint64_t)(index % r->n))
        abort();
    BT_PROTO_FREE(baton__v1__generate_request, g);
    BT_PROTO_FREE(baton__v1__generate_request, base);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int kind = 0; kind < 2; kind++) {
        bt_openai_request_t r;
        bt_openai_error_t e;
        if (bt_openai_parse(kind ? BT_OPENAI_COMPLETION : BT_OPENAI_CHAT, (const char *)data, size,
                            "fuzz", &r, &e) == BT_OK) {
            const int total = r.n * r.n_prompts;
            if (r.n < 1 || r.n_prompts < 1 || total > BT_OPENAI_MAX_N) abort();
            if (total > 1) check_choice(&r, total - 1);
            bt_openai_request_free(&r);
        }
    }
    return 0;
}
