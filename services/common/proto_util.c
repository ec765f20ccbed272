#include "services/common/proto_util.h"

#include "common/alloc.h"

void bt_proto_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = bt_malloc_or_die(n ? n : 1);
    protobuf_c_message_pack(msg, buf);
    *buf_p = buf;
    *len_p = n;
}
