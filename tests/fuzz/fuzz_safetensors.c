/* libFuzzer target: safetensors header parsing and the dequantizing float reads, from bytes.
 *
 *   cmake -S . -B build-fuzz -DBT_FUZZ=ON -DCMAKE_C_COMPILER=clang
 *   cmake --build build-fuzz --target fuzz_safetensors
 *   mkdir -p scratch-corpus   # libFuzzer writes new inputs into the first directory
 *   build-fuzz/bin/fuzz_safetensors -max_total_time=60 scratch-corpus tests/fuzz/corpus/safetensors
 *
 * Any input must either open or fail with a status; a tensor that opened must read as
 * float32 (or be refused) without touching memory outside the image. */
#include "services/engine/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy, so ASan flags any read past the image. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);

    bt_safetensors_t *st = NULL;
    char err[256];
    if (bt_safetensors_open_memory(copy, size, "fuzz.safetensors", &st, err, sizeof err) == BT_OK) {
        size_t n = bt_safetensors_count(st);
        for (size_t i = 0; i < n; i++) {
            const bt_tensor_view_t *t = bt_safetensors_at(st, i);
            if (bt_safetensors_find(st, t->name) != t) abort();
            int64_t shape[BT_SAFETENSORS_MAX_DIMS];
            memcpy(shape, t->shape, sizeof shape);
            if (t->dtype == BT_DTYPE_I8 && t->ndim > 0) shape[t->ndim - 1] *= 2; /* packed FP4 */
            size_t count = 1;
            int ok = 1;
            for (int d = 0; d < t->ndim && ok; d++) {
                if (shape[d] < 0 || (shape[d] && count > ((size_t)1 << 22) / (size_t)shape[d]))
                    ok = 0;
                else
                    count *= (size_t)shape[d];
            }
            if (!ok) continue;
            float *out = malloc((count ? count : 1) * sizeof *out);
            if (!out) continue;
            (void)bt_safetensors_read_f32(st, t->name, t->ndim, shape, out, err, sizeof err);
            free(out);
        }
        bt_safetensors_close(st);
    }
    free(copy);
    return 0;
}
