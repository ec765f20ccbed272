/* libFuzzer target: the gateway's OpenAI request mapping (bodies come from the internet). */
#include "services/gateway/openai.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (int kind = 0; kind < 2; kind++) {
        bt_openai_request_t r;
        bt_openai_error_t e;
        if (bt_openai_parse(kind ? BT_OPENAI_COMPLETION : BT_OPENAI_CHAT, (const char *)data, size, "fuzz", &r, &e) == BT_OK)
            bt_openai_request_free(&r);
    }
    return 0;
}
