/* libFuzzer: the HTTP/1.1 request parser behind common/http (bt_http_parse_probe), no sockets.
 * Byte 0 picks the limits (defaults, or small ones so that 413/431 paths are reached); the
 * rest is what a client sent. The answer must be one the server can give. */
#include "common/http/http.h"
#include "common/log.h"

#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    bt_log_set_level(BT_LOG_OFF);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    bt_http_limits_t lim = bt_http_limits_default();
    if (data[0] & 1) {
        lim.max_header_bytes = 256;
        lim.max_headers = 4;
        lim.max_body_bytes = 64;
    }
    int st = bt_http_parse_probe(data + 1, size - 1, &lim);
    switch (st) {
    case 0:
    case 200:
    case 400:
    case 413:
    case 417:
    case 431:
    case 503:
        break;
    default:
        abort();
    }
    return 0;
}
