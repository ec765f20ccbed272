/* Checkpoint loading: safetensors files mapped read-only, with a hash index over the
 * tensor names and a dequantizing float32 reader for the storage formats of DeepSeek-V4.1
 * (F32/F16/BF16/F64, FP8 e4m3 + UE8M0 block scales, packed FP4 e2m1 + UE8M0 scales).
 *
 *   bt_safetensors_t *st;
 *   char err[256];
 *   if (bt_safetensors_open_dir("/models/ds41", &st, err, sizeof err) != BT_OK) ...
 *   const bt_tensor_view_t *t = bt_safetensors_find(st, "layers.3.attn.wq_a.weight");
 *   int64_t shape[2] = {1280, 5120};
 *   float *w = malloc(1280 * 5120 * sizeof *w);
 *   bt_status_t rc = bt_safetensors_read_f32(st, "layers.3.attn.wq_a.weight", 2, shape, w,
 *                                            err, sizeof err);      // dequantizes FP8
 *   bt_safetensors_close(st);       // unmaps: every view and data pointer dies with it
 *
 * A file is parsed completely at open: every header entry is checked (dtype, shape,
 * offsets inside the data section, size = prod(shape) * dtype size), so a bad file fails
 * there with BT_ERR_BAD_CHECKPOINT and a message naming the file and the tensor, never
 * later with a crash. Data pointers are not necessarily aligned to the element size. */
#ifndef BT_ENGINE_SAFETENSORS_H
#define BT_ENGINE_SAFETENSORS_H

#include "common/status.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    BT_DTYPE_F32,
    BT_DTYPE_F16,
    BT_DTYPE_BF16,
    BT_DTYPE_F64,
    BT_DTYPE_F8_E4M3,
    BT_DTYPE_F8_E8M0,
    BT_DTYPE_I8,
    BT_DTYPE_U8,
    BT_DTYPE_I16,
    BT_DTYPE_I32,
    BT_DTYPE_I64,
    BT_DTYPE_BOOL,
} bt_dtype_t;

#define BT_SAFETENSORS_MAX_DIMS 8

/* Safetensors spelling of a dtype ("F32", "F8_E4M3", ...); "?" when out of range. */
const char *bt_safetensors_dtype_name(bt_dtype_t dtype);
/* Bytes per element; 0 when out of range. */
size_t bt_safetensors_dtype_size(bt_dtype_t dtype);
/* Parses a safetensors dtype name; 0 and *dtype_p on success, -1 when unknown. */
int bt_safetensors_dtype_parse(const char *name, bt_dtype_t *dtype_p);

/* One tensor as stored. All pointers belong to the bt_safetensors_t and live until close. */
typedef struct {
    const char *name;
    bt_dtype_t dtype;
    int ndim;
    int64_t shape[BT_SAFETENSORS_MAX_DIMS];
    const uint8_t *data; /* nbytes bytes inside the mapping; no alignment promised */
    size_t nbytes;
    const char *file; /* the file it lives in (as opened) */
} bt_tensor_view_t;

typedef struct bt_safetensors bt_safetensors_t;

/* Opens and validates one .safetensors file. */
bt_status_t bt_safetensors_open(const char *path, bt_safetensors_t **st_p, char *err,
                                size_t errlen);
/* Opens a checkpoint directory: model.safetensors.index.json and the shards its
 * "weight_map" names (plain file names in the same directory), or else model.safetensors.
 * BT_ERR_NOT_FOUND when the directory holds neither. */
bt_status_t bt_safetensors_open_dir(const char *dir, bt_safetensors_t **st_p, char *err,
                                    size_t errlen);
/* Parses a safetensors image already in memory (the fuzzer's entry point, and for tests).
 * The bytes are not copied: the caller keeps them alive and unchanged until close. `label`
 * stands for the file name in messages and in the views' `file`. */
bt_status_t bt_safetensors_open_memory(const uint8_t *data, size_t len, const char *label,
                                       bt_safetensors_t **st_p, char *err, size_t errlen);
/* Unmaps and frees; NULL is a no-op. */
void bt_safetensors_close(bt_safetensors_t *st);

/* The tensor called `name`, or NULL (hash lookup). */
const bt_tensor_view_t *bt_safetensors_find(const bt_safetensors_t *st, const char *name);
/* All tensors: files in the order opened (shards sorted by name), each in header order. */
size_t bt_safetensors_count(const bt_safetensors_t *st);
const bt_tensor_view_t *bt_safetensors_at(const bt_safetensors_t *st, size_t i);

/* Reads tensor `name` as float32 into `out` (caller-allocated, prod(shape) floats) after
 * checking it has the LOGICAL shape given (ndim dims), dequantizing on the way:
 *   F32 F16 BF16 F64  converted;
 *   F8_E4M3           needs `<prefix>.scale` in F8_E8M0 (prefix = name without a trailing
 *                     ".weight"), either 32x32 blocks: scale [ceil(rows/32), ceil(cols/32)],
 *                     w = fp8 * scale[r/32][c/32], or per row per 32 columns (engram
 *                     tables): scale [rows, ceil(cols/32)], w = fp8 * scale[r][c/32];
 *                     rows = product of all dims but the last, cols = the last dim;
 *   I8                packed FP4: stored [.., cols/2], two e2m1 codes a byte (low nibble =
 *                     even column, bit 3 = sign), `<prefix>.scale` F8_E8M0
 *                     [rows, ceil(cols/32)]: w = e2m1 * scale[r][c/32].
 * Any mismatch (shape, dtype that has no float reading, missing tensor, missing or
 * misshapen scale) is BT_ERR_BAD_CHECKPOINT with a message naming the file and tensor.
 * `out` is written only on success. */
bt_status_t bt_safetensors_read_f32(const bt_safetensors_t *st, const char *name, int ndim,
                                    const int64_t *shape, float *out, char *err, size_t errlen);

/* One tensor to write: `data` holds prod(shape) * dtype size bytes in storage order (for
 * packed FP4 give the stored I8 shape [.., cols/2]). */
typedef struct {
    const char *name;
    bt_dtype_t dtype;
    int ndim;
    int64_t shape[BT_SAFETENSORS_MAX_DIMS];
    const void *data;
} bt_tensor_write_t;

/* Writes a .safetensors file atomically (a temp file in the same directory, then rename).
 * Tensors are laid out contiguously in the order given; the header carries
 * {"__metadata__":{"format":"pt"}} and is padded with spaces to a multiple of 8 bytes.
 * BT_ERR_INVALID_ARG for a bad tensor description (duplicate or empty name, bad dtype,
 * ndim or dim), BT_ERR_IO when the file cannot be written. */
bt_status_t bt_safetensors_write(const char *path, const bt_tensor_write_t *tensors, size_t n,
                                 char *err, size_t errlen);

#endif
