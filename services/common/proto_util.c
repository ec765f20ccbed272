#include "services/common/proto_util.h"

#include "common/alloc.h"

#include <stdlib.h>

void bt_proto_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = bt_malloc_or_die(n ? n : 1);
    protobuf_c_message_pack(msg, buf);
    *buf_p = buf;
    *len_p = n;
}

void bt_proto_reply(bt_rpc_call_t *call, const ProtobufCMessage *msg)
{
    uint8_t *buf;
    size_t len;
    bt_proto_pack(msg, &buf, &len);
    bt_rpc_call_reply(call, buf, len);
    free(buf);
}
