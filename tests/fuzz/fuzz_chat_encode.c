/* libFuzzer: chat requests (untrusted JSON) through the DeepSeek-V4.1 chat encoding. Any
 * input must give either a prompt or BT_ERR_BAD_REQUEST with a message; a request the encoder
 * takes, its thinking rule (bt_chat_thinking) takes too. */
#include "common/text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bt_tokenizer_t *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[256];
    if (bt_tokenizer_load(BT_GOLDEN_DIR "/tokenizer", &tok, err, sizeof err) != BT_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cJSON *req = bt_chat_parse_request((const char *)data, size);
    if (!req) return 0;
    char err[256] = "";
    int32_t *ids = NULL;
    size_t n = 0;
    bt_status_t st = bt_chat_encode(tok, req, &ids, &n, err, sizeof err);
    if (st == BT_OK) {
        if (n == 0 || ids[0] != bt_tokenizer_bos_id(tok)) abort();
        free(ids);
        /* the router's switch for the reasoning parser reads what the encoder accepted */
        bool thinking;
        if (bt_chat_thinking(req, &thinking, err, sizeof err) != BT_OK) abort();
    } else if (st != BT_ERR_BAD_REQUEST || !err[0]) {
        abort();
    }
    cJSON_Delete(req);
    return 0;
}
