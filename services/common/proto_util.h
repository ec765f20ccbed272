/* Thin helpers around protobuf-c so pack/unpack ownership never leaks into services.
 *
 *   uint8_t *buf; size_t len;
 *   bt_proto_pack(&msg.base, &buf, &len);       // malloc'd; caller frees
 *   Baton__V1__DecodeEvent *ev = BT_PROTO_UNPACK(baton__v1__decode_event, data, len);
 *   if (!ev) ...bad bytes...;
 *   BT_PROTO_FREE(baton__v1__decode_event, ev);
 *   bt_proto_reply(call, &resp.base);           // a unary call's answer
 */
#ifndef BT_SERVICES_PROTO_UTIL_H
#define BT_SERVICES_PROTO_UTIL_H

#include "common/rpc/rpc.h"
#include "proto/baton/v1/api.pb-c.h"
#include "proto/baton/v1/kv.pb-c.h"
#include "proto/baton/v1/worker.pb-c.h"

#include <stddef.h>
#include <stdint.h>

void bt_proto_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p);
/* Answers a unary call with msg (packed here). */
void bt_proto_reply(bt_rpc_call_t *call, const ProtobufCMessage *msg);

#define BT_PROTO_UNPACK(prefix, data, len) prefix##__unpack(NULL, (len), (data))
#define BT_PROTO_FREE(prefix, msg) prefix##__free_unpacked((msg), NULL)

#endif
