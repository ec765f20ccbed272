/* Thin helpers around protobuf-c so pack/unpack ownership never leaks into services.
 *
 *   uint8_t *buf; size_t len;
 *   bt_proto_pack(&msg.base, &buf, &len);       // malloc'd; caller frees
 *   Baton__V1__DecodeEvent *ev = BT_PROTO_UNPACK(baton__v1__decode_event, data, len);
 *   if (!ev) ...bad bytes...;
 *   BT_PROTO_FREE(baton__v1__decode_event, ev);
 */
#ifndef BT_SERVICES_PROTO_UTIL_H
#define BT_SERVICES_PROTO_UTIL_H

#include "proto/baton/v1/api.pb-c.h"
#include "proto/baton/v1/kv.pb-c.h"
#include "proto/baton/v1/worker.pb-c.h"

#include <stddef.h>
#include <stdint.h>

void bt_proto_pack(const ProtobufCMessage *msg, uint8_t **buf_p, size_t *len_p);

#define BT_PROTO_UNPACK(prefix, data, len) prefix##__unpack(NULL, (len), (data))
#define BT_PROTO_FREE(prefix, msg) prefix##__free_unpacked((msg), NULL)

#endif
