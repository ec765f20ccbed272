#include "bt_test.h"

#include "kernels/cpu/quant.h"
#include "services/engine/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GOLDEN_A BT_GOLDEN_DIR "/golden-a/model.safetensors"
#define GOLDEN_QUANT BT_GOLDEN_DIR "/golden-a-quant/model.safetensors"
#define GOLDEN_EXACT BT_GOLDEN_DIR "/golden-a-exact/model.safetensors"
#define GOLDEN_DATA BT_GOLDEN_DIR "/golden-a/golden.safetensors"

/* ---- scratch files ------------------------------------------------------------------------ */

static char tmp_dir[64];
static char *tmp_files[256];
static int n_tmp_files;

static const char *tmp_path(const char *name)
{
    static char buf[8][256];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 256, "%s/%s", tmp_dir, name);
    for (int i = 0; i < n_tmp_files; i++)
        if (!strcmp(tmp_files[i], p)) return p;
    if (n_tmp_files < 256) tmp_files[n_tmp_files++] = strdup(p);
    return p;
}

static void tmp_cleanup(void)
{
    for (int i = 0; i < n_tmp_files; i++) {
        unlink(tmp_files[i]);
        free(tmp_files[i]);
    }
    rmdir(tmp_dir);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    BT_CHECK(f != NULL);
    if (!f) return;
    if (n) BT_CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

/* A file with the given 8-byte length field, header text and `data_len` zero bytes. */
static void write_raw(const char *path, uint64_t hlen_field, const char *header, size_t data_len)
{
    size_t hl = strlen(header);
    size_t n = 8 + hl + data_len;
    uint8_t *buf = calloc(1, n);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    write_bytes(path, buf, n);
    free(buf);
}

/* ---- golden files ------------------------------------------------------------------------- */

static void test_open_golden(void)
{
    const char *paths[] = {GOLDEN_A, GOLDEN_QUANT, GOLDEN_EXACT, GOLDEN_DATA,
                           BT_GOLDEN_DIR "/golden-a-exact/golden.safetensors",
                           BT_GOLDEN_DIR "/golden-a-quant/golden.safetensors"};
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++) {
        bt_safetensors_t *st = NULL;
        char err[512] = "";
        bt_status_t rc = bt_safetensors_open(paths[k], &st, err, sizeof err);
        BT_CHECK_MSG(rc == BT_OK, "%s: %s", paths[k], err);
        if (rc != BT_OK) continue;
        BT_CHECK(bt_safetensors_count(st) > 0);
        /* every view is findable by its name and lies inside its file */
        for (size_t i = 0; i < bt_safetensors_count(st); i++) {
            const bt_tensor_view_t *t = bt_safetensors_at(st, i);
            BT_CHECK(bt_safetensors_find(st, t->name) == t);
            BT_CHECK(t->file && !strcmp(t->file, paths[k]));
        }
        BT_CHECK(bt_safetensors_at(st, bt_safetensors_count(st)) == NULL);
        BT_CHECK(bt_safetensors_find(st, "no.such.tensor") == NULL);
        bt_safetensors_close(st);
    }
    bt_safetensors_close(NULL);
}

static void test_golden_shapes(void)
{
    bt_safetensors_t *a = NULL, *q = NULL, *g = NULL;
    char err[512] = "";
    BT_CHECK(bt_safetensors_open(GOLDEN_A, &a, err, sizeof err) == BT_OK);
    BT_CHECK(bt_safetensors_open(GOLDEN_QUANT, &q, err, sizeof err) == BT_OK);
    BT_CHECK(bt_safetensors_open(GOLDEN_DATA, &g, err, sizeof err) == BT_OK);
    if (!a || !q || !g) goto out;

    BT_CHECK_EQ_INT(bt_safetensors_count(a), 495);
    BT_CHECK_EQ_INT(bt_safetensors_count(q), 817);
    const bt_tensor_view_t *t = bt_safetensors_find(a, "embed.weight");
    BT_CHECK(t && t->dtype == BT_DTYPE_F32 && t->ndim == 2 && t->shape[0] == 1014 &&
             t->shape[1] == 64 && t->nbytes == 1014 * 64 * 4);

    t = bt_safetensors_find(q, "layers.1.attn.wq_b.weight");
    BT_CHECK(t && t->dtype == BT_DTYPE_F8_E4M3 && t->shape[0] == 256 && t->shape[1] == 48);
    t = bt_safetensors_find(q, "layers.1.attn.wq_b.scale");
    BT_CHECK(t && t->dtype == BT_DTYPE_F8_E8M0 && t->shape[0] == 8 && t->shape[1] == 2);
    t = bt_safetensors_find(q, "layers.0.ffn.experts.0.w2.weight");
    BT_CHECK(t && t->dtype == BT_DTYPE_I8 && t->shape[0] == 64 && t->shape[1] == 16);
    t = bt_safetensors_find(q, "layers.1.engram.embed.scale");
    BT_CHECK(t && t->dtype == BT_DTYPE_F8_E8M0 && t->shape[0] == 1916 && t->shape[1] == 1);

    t = bt_safetensors_find(g, "engram.primes");
    BT_CHECK(t && t->dtype == BT_DTYPE_I64 && t->ndim == 3 && t->shape[0] == 2 &&
             t->shape[1] == 3 && t->shape[2] == 2);
    t = bt_safetensors_find(g, "prompt0.robust");
    BT_CHECK(t && t->dtype == BT_DTYPE_U8);

    /* a float read of a plain F32 tensor is its bytes */
    {
        int64_t shape[2] = {1014, 64};
        float *w = malloc(1014 * 64 * sizeof *w);
        BT_CHECK(bt_safetensors_read_f32(a, "embed.weight", 2, shape, w, err, sizeof err) ==
                 BT_OK);
        t = bt_safetensors_find(a, "embed.weight");
        BT_CHECK(t && !memcmp(w, t->data, t->nbytes));
        free(w);
    }
out:
    bt_safetensors_close(a);
    bt_safetensors_close(q);
    bt_safetensors_close(g);
}

/* Quantization error bound of `w` (dequantized) against the float it came from. */
static int on_e4m3_grid(float x)
{
    return bt_e4m3_to_f32(bt_f32_to_e4m3(x)) == x;
}

static int on_e2m1_grid(float x)
{
    return bt_e2m1_to_f32(bt_f32_to_e2m1(x)) == x && fabsf(x) <= 6.0f;
}

/* Dequantizes every FP8 / FP4 tensor of golden-a-quant and compares it with golden-a. */
static void test_golden_dequant(void)
{
    bt_safetensors_t *a = NULL, *q = NULL;
    char err[512] = "";
    BT_CHECK(bt_safetensors_open(GOLDEN_A, &a, err, sizeof err) == BT_OK);
    BT_CHECK(bt_safetensors_open(GOLDEN_QUANT, &q, err, sizeof err) == BT_OK);
    if (!a || !q) goto out;

    int n_fp8 = 0, n_fp4 = 0, n_engram = 0;
    for (size_t i = 0; i < bt_safetensors_count(q); i++) {
        const bt_tensor_view_t *t = bt_safetensors_at(q, i);
        if (t->dtype != BT_DTYPE_F8_E4M3 && t->dtype != BT_DTYPE_I8) continue;
        const bt_tensor_view_t *ref = bt_safetensors_find(a, t->name);
        BT_CHECK_MSG(ref && ref->dtype == BT_DTYPE_F32 && ref->ndim == 2, "%s", t->name);
        if (!ref || ref->ndim != 2) continue;
        int fp4 = t->dtype == BT_DTYPE_I8;
        int engram = strstr(t->name, "engram.embed") != NULL;
        n_fp8 += !fp4 && !engram;
        n_fp4 += fp4;
        n_engram += engram;

        /* the logical shape is the float tensor's */
        int64_t rows = ref->shape[0], cols = ref->shape[1];
        float *w = malloc((size_t)(rows * cols) * sizeof *w);
        float *r = malloc((size_t)(rows * cols) * sizeof *r);
        bt_status_t rc = bt_safetensors_read_f32(q, t->name, 2, ref->shape, w, err, sizeof err);
        BT_CHECK_MSG(rc == BT_OK, "%s", err);
        BT_CHECK(bt_safetensors_read_f32(a, t->name, 2, ref->shape, r, err, sizeof err) == BT_OK);
        if (rc == BT_OK) {
            char sname[256];
            snprintf(sname, sizeof sname, "%.*s.scale", (int)(strlen(t->name) - 7), t->name);
            const bt_tensor_view_t *s = bt_safetensors_find(q, sname);
            BT_CHECK(s != NULL);
            int bad_grid = 0, bad_err = 0, bad_finite = 0;
            for (int64_t y = 0; s && y < rows; y++) {
                for (int64_t x = 0; x < cols; x++) {
                    int64_t srow = (fp4 || engram) ? y : y / 32;
                    float scale = bt_e8m0_to_f32(s->data[srow * s->shape[1] + x / 32]);
                    float v = w[y * cols + x], ref_v = r[y * cols + x];
                    if (!isfinite(v)) bad_finite++;
                    float unit = v / scale; /* exact: scale is a power of two */
                    if (fp4 ? !on_e2m1_grid(unit) : !on_e4m3_grid(unit)) bad_grid++;
                    /* round-to-nearest error: half a step of the grid */
                    float bound = fp4 ? fmaxf(0.25f * scale, fabsf(ref_v) * 0.25f)
                                      : fmaxf(scale * 0x1p-10f, fabsf(ref_v) * 0x1p-4f);
                    if (fabsf(v - ref_v) > bound * 1.0001f) bad_err++;
                }
            }
            BT_CHECK_MSG(!bad_finite && !bad_grid && !bad_err,
                         "%s: %d non-finite, %d off grid, %d beyond the rounding bound", t->name,
                         bad_finite, bad_grid, bad_err);
        }
        free(w);
        free(r);
    }
    BT_CHECK_EQ_INT(n_fp8, 82);
    BT_CHECK_EQ_INT(n_fp4, 240);
    BT_CHECK_EQ_INT(n_engram, 2);
out:
    bt_safetensors_close(a);
    bt_safetensors_close(q);
}

/* ---- writer round trip -------------------------------------------------------------------- */

static void test_write_round_trip(void)
{
    float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, -0.0f, 1e-3f};
    uint16_t f16[3] = {bt_f32_to_f16(1.5f), bt_f32_to_f16(-65504.0f), bt_f32_to_f16(0x1p-24f)};
    uint16_t bf16[2] = {bt_f32_to_bf16(3.0f), bt_f32_to_bf16(-1e30f)};
    double f64[2] = {0.1, -7.0};
    int64_t i64[3] = {INT64_MIN, 0, INT64_MAX};
    uint8_t u8[1] = {200};
    uint8_t boolean[4] = {1, 0, 1, 1};
    /* FP8 [3, 40]: 32x32 blocks -> scale [1, 2] */
    uint8_t fp8[3 * 40], fp8_scale[2] = {127 + 2, 127 - 3}; /* 4, 1/8 */
    for (int i = 0; i < 3 * 40; i++) fp8[i] = (uint8_t)((i * 7) % 0x7e);
    /* FP4 logical [2, 64] stored [2, 32], scale [2, 2] */
    uint8_t fp4[2 * 32], fp4_scale[4] = {127, 128, 126, 130};
    for (int i = 0; i < 2 * 32; i++) fp4[i] = (uint8_t)(i * 37 + 11);
    /* an engram-style table: [40, 64] per-row scale [40, 2] */
    uint8_t tab[40 * 64], tab_scale[40 * 2];
    for (int i = 0; i < 40 * 64; i++) tab[i] = (uint8_t)((i * 13) % 0x7e) | (uint8_t)((i & 1) << 7);
    for (int i = 0; i < 40 * 2; i++) tab_scale[i] = (uint8_t)(120 + i % 10);

    bt_tensor_write_t tw[] = {
        {"a.f32", BT_DTYPE_F32, 2, {2, 3}, f32},
        {"b.f16", BT_DTYPE_F16, 1, {3}, f16},
        {"c.bf16", BT_DTYPE_BF16, 2, {1, 2}, bf16},
        {"d.f64", BT_DTYPE_F64, 1, {2}, f64},
        {"e.i64", BT_DTYPE_I64, 1, {3}, i64},
        {"scalar", BT_DTYPE_U8, 0, {0}, u8},
        {"empty", BT_DTYPE_F32, 2, {0, 5}, NULL},
        {"flags", BT_DTYPE_BOOL, 1, {4}, boolean},
        {"lin.weight", BT_DTYPE_F8_E4M3, 2, {3, 40}, fp8},
        {"lin.scale", BT_DTYPE_F8_E8M0, 2, {1, 2}, fp8_scale},
        {"exp.weight", BT_DTYPE_I8, 2, {2, 32}, fp4},
        {"exp.scale", BT_DTYPE_F8_E8M0, 2, {2, 2}, fp4_scale},
        {"tab.weight", BT_DTYPE_F8_E4M3, 2, {40, 64}, tab},
        {"tab.scale", BT_DTYPE_F8_E8M0, 2, {40, 2}, tab_scale},
        {"we\"ird\\name\n", BT_DTYPE_U8, 1, {1}, u8},
    };
    size_t nt = sizeof tw / sizeof tw[0];
    const char *path = tmp_path("rt.safetensors");
    char err[512] = "";
    BT_CHECK_MSG(bt_safetensors_write(path, tw, nt, err, sizeof err) == BT_OK, "%s", err);

    /* the header length is a multiple of 8 and the file ends at the last tensor */
    FILE *f = fopen(path, "rb");
    BT_CHECK(f != NULL);
    if (f) {
        uint8_t lb[8];
        BT_CHECK(fread(lb, 1, 8, f) == 8);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | lb[i];
        BT_CHECK(hl % 8 == 0);
        fseek(f, 0, SEEK_END);
        size_t total = 0;
        for (size_t i = 0; i < nt; i++) {
            size_t c = bt_safetensors_dtype_size(tw[i].dtype);
            for (int d = 0; d < tw[i].ndim; d++) c *= (size_t)tw[i].shape[d];
            total += c;
        }
        BT_CHECK_EQ_INT(ftell(f), (long)(8 + hl + total));
        fclose(f);
    }

    bt_safetensors_t *st = NULL;
    BT_CHECK_MSG(bt_safetensors_open(path, &st, err, sizeof err) == BT_OK, "%s", err);
    if (!st) return;
    BT_CHECK_EQ_INT(bt_safetensors_count(st), nt);
    for (size_t i = 0; i < nt; i++) {
        const bt_tensor_view_t *t = bt_safetensors_find(st, tw[i].name);
        BT_CHECK_MSG(t != NULL, "%s", tw[i].name);
        if (!t) continue;
        BT_CHECK(bt_safetensors_at(st, i) == t); /* written order kept */
        BT_CHECK(t->dtype == tw[i].dtype && t->ndim == tw[i].ndim);
        for (int d = 0; d < t->ndim; d++) BT_CHECK(t->shape[d] == tw[i].shape[d]);
        BT_CHECK(!t->nbytes || !memcmp(t->data, tw[i].data, t->nbytes));
    }

    float out[40 * 64];
    int64_t s23[2] = {2, 3};
    BT_CHECK(bt_safetensors_read_f32(st, "a.f32", 2, s23, out, err, sizeof err) == BT_OK);
    BT_CHECK(!memcmp(out, f32, sizeof f32));
    int64_t s3[1] = {3};
    BT_CHECK(bt_safetensors_read_f32(st, "b.f16", 1, s3, out, err, sizeof err) == BT_OK);
    BT_CHECK(out[0] == 1.5f && out[1] == -65504.0f && out[2] == 0x1p-24f);
    int64_t s12[2] = {1, 2};
    BT_CHECK(bt_safetensors_read_f32(st, "c.bf16", 2, s12, out, err, sizeof err) == BT_OK);
    BT_CHECK(out[0] == 3.0f && out[1] == bt_bf16_to_f32(bt_f32_to_bf16(-1e30f)));
    int64_t s2[1] = {2};
    BT_CHECK(bt_safetensors_read_f32(st, "d.f64", 1, s2, out, err, sizeof err) == BT_OK);
    BT_CHECK(out[0] == (float)0.1 && out[1] == -7.0f);
    int64_t s05[2] = {0, 5};
    BT_CHECK(bt_safetensors_read_f32(st, "empty", 2, s05, NULL, err, sizeof err) == BT_OK);

    int64_t s340[2] = {3, 40};
    BT_CHECK_MSG(bt_safetensors_read_f32(st, "lin.weight", 2, s340, out, err, sizeof err) ==
                     BT_OK, "%s", err);
    int bad = 0;
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 40; c++)
            bad += out[r * 40 + c] !=
                   bt_e4m3_to_f32(fp8[r * 40 + c]) * bt_e8m0_to_f32(fp8_scale[c / 32]);
    BT_CHECK_EQ_INT(bad, 0);

    int64_t s264[2] = {2, 64};
    BT_CHECK_MSG(bt_safetensors_read_f32(st, "exp.weight", 2, s264, out, err, sizeof err) ==
                     BT_OK, "%s", err);
    bad = 0;
    for (int r = 0; r < 2; r++) {
        for (int c = 0; c < 64; c++) {
            uint8_t byte = fp4[r * 32 + c / 2];
            uint8_t code = (c % 2) ? byte >> 4 : byte & 15;
            bad += out[r * 64 + c] != bt_e2m1_to_f32(code) * bt_e8m0_to_f32(fp4_scale[r * 2 + c / 32]);
        }
    }
    BT_CHECK_EQ_INT(bad, 0);
    /* spot values: low nibble first, bit 3 is the sign */
    BT_CHECK(out[0] == bt_e2m1_to_f32(fp4[0] & 15) * 1.0f);
    BT_CHECK(out[1] == bt_e2m1_to_f32(fp4[0] >> 4) * 1.0f);

    int64_t s4064[2] = {40, 64};
    BT_CHECK_MSG(bt_safetensors_read_f32(st, "tab.weight", 2, s4064, out, err, sizeof err) ==
                     BT_OK, "%s", err);
    bad = 0;
    for (int r = 0; r < 40; r++)
        for (int c = 0; c < 64; c++)
            bad += out[r * 64 + c] !=
                   bt_e4m3_to_f32(tab[r * 64 + c]) * bt_e8m0_to_f32(tab_scale[r * 2 + c / 32]);
    BT_CHECK_EQ_INT(bad, 0);
    bt_safetensors_close(st);

    /* rewriting replaces the file atomically and leaves no temp file behind */
    BT_CHECK(bt_safetensors_write(path, tw, 1, err, sizeof err) == BT_OK);
    BT_CHECK(bt_safetensors_open(path, &st, err, sizeof err) == BT_OK);
    BT_CHECK_EQ_INT(bt_safetensors_count(st), 1);
    bt_safetensors_close(st);
}

static void test_write_rejects(void)
{
    float x[2] = {0};
    char err[512] = "";
    const char *path = tmp_path("rej.safetensors");
    bt_tensor_write_t dup[] = {{"x", BT_DTYPE_F32, 1, {2}, x}, {"x", BT_DTYPE_F32, 1, {2}, x}};
    BT_CHECK(bt_safetensors_write(path, dup, 2, err, sizeof err) == BT_ERR_INVALID_ARG);
    BT_CHECK(strstr(err, "'x'") != NULL);
    bt_tensor_write_t neg[] = {{"x", BT_DTYPE_F32, 1, {-2}, x}};
    BT_CHECK(bt_safetensors_write(path, neg, 1, err, sizeof err) == BT_ERR_INVALID_ARG);
    bt_tensor_write_t nodata[] = {{"x", BT_DTYPE_F32, 1, {2}, NULL}};
    BT_CHECK(bt_safetensors_write(path, nodata, 1, err, sizeof err) == BT_ERR_INVALID_ARG);
    bt_tensor_write_t dims[] = {{"x", BT_DTYPE_F32, 9, {1}, x}};
    BT_CHECK(bt_safetensors_write(path, dims, 1, err, sizeof err) == BT_ERR_INVALID_ARG);
    bt_tensor_write_t noname[] = {{"", BT_DTYPE_F32, 1, {2}, x}};
    BT_CHECK(bt_safetensors_write(path, noname, 1, err, sizeof err) == BT_ERR_INVALID_ARG);
    BT_CHECK(access(path, F_OK) != 0); /* nothing written */
    BT_CHECK(bt_safetensors_write("/nonexistent-dir/x.safetensors", neg + 0, 0, err, sizeof err) ==
             BT_ERR_IO);
}

/* ---- float read errors -------------------------------------------------------------------- */

static void test_read_f32_errors(void)
{
    float w[64] = {0};
    uint8_t b[64] = {0};
    uint8_t sc[4] = {127, 127, 127, 127};
    bt_tensor_write_t tw[] = {
        {"plain", BT_DTYPE_F32, 2, {4, 16}, w},
        {"ids", BT_DTYPE_I64, 1, {8}, w},
        {"noscale.weight", BT_DTYPE_F8_E4M3, 2, {2, 32}, b},
        {"badscale.weight", BT_DTYPE_F8_E4M3, 2, {2, 32}, b},
        {"badscale.scale", BT_DTYPE_F8_E8M0, 2, {3, 1}, sc},
        {"f32scale.weight", BT_DTYPE_F8_E4M3, 2, {2, 32}, b},
        {"f32scale.scale", BT_DTYPE_F32, 2, {1, 1}, w},
        {"fp4.weight", BT_DTYPE_I8, 2, {2, 32}, b},
        {"fp4.scale", BT_DTYPE_F8_E8M0, 2, {2, 2}, sc},
    };
    const char *path = tmp_path("errors.safetensors");
    char err[512] = "";
    BT_CHECK(bt_safetensors_write(path, tw, sizeof tw / sizeof tw[0], err, sizeof err) == BT_OK);
    bt_safetensors_t *st = NULL;
    BT_CHECK(bt_safetensors_open(path, &st, err, sizeof err) == BT_OK);
    if (!st) return;
    float out[256];
    int64_t s416[2] = {4, 16}, s164[2] = {16, 4}, s8[1] = {8}, s232[2] = {2, 32}, s264[2] = {2, 64};
    int64_t s32[1] = {64};
    struct {
        const char *name;
        int ndim;
        const int64_t *shape;
    } cases[] = {
        {"missing.weight", 2, s416}, /* absent */
        {"plain", 2, s164},          /* wrong shape */
        {"plain", 1, s32},           /* wrong ndim */
        {"ids", 1, s8},              /* integers have no float reading */
        {"noscale.weight", 2, s232}, /* no scale */
        {"badscale.weight", 2, s232}, /* scale of neither layout */
        {"f32scale.weight", 2, s232}, /* scale not E8M0 */
        {"fp4.weight", 2, s232},     /* packed: the stored shape is not the logical one */
        {"fp4.weight", 2, s416},
        {"fp4.weight", 1, s32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int k = 0; k < 256; k++) out[k] = 12345.0f;
        err[0] = '\0';
        bt_status_t rc =
            bt_safetensors_read_f32(st, cases[i].name, cases[i].ndim, cases[i].shape, out, err,
                                    sizeof err);
        BT_CHECK_MSG(rc == BT_ERR_BAD_CHECKPOINT, "case %zu (%s): %s", i, cases[i].name,
                     bt_status_name(rc));
        BT_CHECK_MSG(strstr(err, "errors.safetensors") && strstr(err, cases[i].name), "case %zu: %s",
                     i, err);
        BT_CHECK(out[0] == 12345.0f); /* untouched on failure */
    }
    /* the FP4 tensor reads fine with its logical shape */
    BT_CHECK(bt_safetensors_read_f32(st, "fp4.weight", 2, s264, out, err, sizeof err) == BT_OK);
    bt_safetensors_close(st);
}

/* ---- corrupt files ------------------------------------------------------------------------ */

static void test_corrupt_files(void)
{
    static const struct {
        const char *why;
        const char *header; /* NULL: raw bytes below */
        int64_t hlen;       /* -1: strlen(header) */
        size_t data_len;
        const char *in_msg; /* a word the message must carry (besides the file name) */
    } cases[] = {
        {"header length past EOF", "{}", 4096, 0, "past the end"},
        {"absurd header length", "{}", (int64_t)1 << 40, 0, "absurd"},
        {"invalid JSON", "{\"a\": {\"dtype\": \"F32\",", -1, 0, "JSON"},
        {"not an object", "[1, 2, 3]", -1, 0, "object"},
        {"trailing bytes", "{} x", -1, 0, "trailing"},
        {"entry not an object", "{\"t\": 5}", -1, 0, "'t'"},
        {"entry an array", "{\"t\": [1]}", -1, 0, "'t'"},
        {"metadata not an object", "{\"__metadata__\": 3}", -1, 0, "__metadata__"},
        {"missing dtype", "{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, "'t'"},
        {"unknown dtype", "{\"t\": {\"dtype\": \"F128\", \"shape\": [1], \"data_offsets\": [0, 16]}}",
         -1, 16, "F128"},
        {"dtype not a string", "{\"t\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}",
         -1, 4, "'t'"},
        {"missing shape", "{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", -1, 4, "'t'"},
        {"negative dim", "{\"t\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}",
         -1, 4, "shape"},
        {"fractional dim", "{\"t\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}",
         -1, 4, "shape"},
        {"string dim", "{\"t\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}",
         -1, 4, "shape"},
        {"huge dim", "{\"t\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 4]}}",
         -1, 4, "shape"},
        {"overflowing shape",
         "{\"t\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], "
         "\"data_offsets\": [0, 4]}}",
         -1, 4, "overflow"},
        {"byte count overflow",
         "{\"t\": {\"dtype\": \"F64\", \"shape\": [2147483648, 4294967296], "
         "\"data_offsets\": [0, 4]}}",
         -1, 4, "overflow"},
        {"too many dims",
         "{\"t\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", -1,
         1, "dims"},
        {"offsets missing", "{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", -1, 4, "data_offsets"},
        {"offsets one number", "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4]}}",
         -1, 4, "data_offsets"},
        {"offsets three numbers",
         "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", -1, 8,
         "data_offsets"},
        {"offsets strings",
         "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", \"4\"]}}", -1, 4,
         "data_offsets"},
        {"offsets negative",
         "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", -1, 4,
         "data_offsets"},
        {"offsets reversed",
         "{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", -1, 4,
         "data_offsets"},
        {"end past data", "{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
         -1, 4, "past the data"},
        {"size mismatch", "{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
         -1, 8, "need 8"},
        {"packed I8 counted as stored",
         "{\"t\": {\"dtype\": \"I8\", \"shape\": [2, 4], \"data_offsets\": [0, 4]}}", -1, 8,
         "need 8"},
        {"duplicate name",
         "{\"t\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, "
         "\"t\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
         -1, 2, "twice"},
        {"empty name", "{\"\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", -1,
         1, "empty"},
    };
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "corrupt%02zu.safetensors", i);
        const char *path = tmp_path(name);
        int64_t hlen = cases[i].hlen >= 0 ? cases[i].hlen : (int64_t)strlen(cases[i].header);
        write_raw(path, (uint64_t)hlen, cases[i].header, cases[i].data_len);
        bt_safetensors_t *st = NULL;
        err[0] = '\0';
        bt_status_t rc = bt_safetensors_open(path, &st, err, sizeof err);
        BT_CHECK_MSG(rc == BT_ERR_BAD_CHECKPOINT, "%s: got %s", cases[i].why, bt_status_name(rc));
        BT_CHECK_MSG(strstr(err, name) != NULL, "%s: message '%s' lacks the file name",
                     cases[i].why, err);
        BT_CHECK_MSG(strstr(err, cases[i].in_msg) != NULL, "%s: message '%s' lacks '%s'",
                     cases[i].why, err, cases[i].in_msg);
        BT_CHECK(st == NULL);
        bt_safetensors_close(st);

        /* the same bytes through the memory entry point */
        FILE *f = fopen(path, "rb");
        if (f) {
            uint8_t buf[4096];
            size_t n = fread(buf, 1, sizeof buf, f);
            fclose(f);
            err[0] = '\0';
            rc = bt_safetensors_open_memory(buf, n, "mem-label", &st, err, sizeof err);
            BT_CHECK_MSG(rc == BT_ERR_BAD_CHECKPOINT && strstr(err, "mem-label"), "%s (memory): %s",
                         cases[i].why, err);
        }
    }

    /* files shorter than the length field */
    for (size_t len = 0; len < 8; len++) {
        const char *path = tmp_path("short.safetensors");
        write_bytes(path, "\x02\0\0\0\0\0\0\0", len);
        bt_safetensors_t *st = NULL;
        err[0] = '\0';
        BT_CHECK_EQ_INT(bt_safetensors_open(path, &st, err, sizeof err), BT_ERR_BAD_CHECKPOINT);
        BT_CHECK_MSG(strstr(err, "short.safetensors") != NULL, "%s", err);
    }
    /* missing file, directory */
    bt_safetensors_t *st = NULL;
    BT_CHECK_EQ_INT(bt_safetensors_open(tmp_path("absent.safetensors"), &st, err, sizeof err),
                    BT_ERR_NOT_FOUND);
    BT_CHECK(strstr(err, "absent.safetensors") != NULL);
    BT_CHECK(bt_safetensors_open(tmp_dir, &st, err, sizeof err) == BT_ERR_BAD_CHECKPOINT);

    /* a valid minimal file still opens: an empty header, and padding spaces */
    const char *ok = tmp_path("ok.safetensors");
    write_raw(ok, 8, "{}      ", 0);
    BT_CHECK(bt_safetensors_open(ok, &st, err, sizeof err) == BT_OK);
    BT_CHECK_EQ_INT(bt_safetensors_count(st), 0);
    bt_safetensors_close(st);
    st = NULL;
    const char *hdr = "{\"__metadata__\":{\"k\":\"v\"},\"t\":{\"dtype\":\"BF16\",\"shape\":[],"
                      "\"data_offsets\":[0,2]}}  \n";
    write_raw(ok, strlen(hdr), hdr, 2);
    BT_CHECK_MSG(bt_safetensors_open(ok, &st, err, sizeof err) == BT_OK, "%s", err);
    const bt_tensor_view_t *t = bt_safetensors_find(st, "t");
    BT_CHECK(t && t->ndim == 0 && t->nbytes == 2);
    bt_safetensors_close(st);
}

/* ---- directories and shards --------------------------------------------------------------- */

static void write_index(const char *json)
{
    write_bytes(tmp_path("model.safetensors.index.json"), json, strlen(json));
}

static void test_open_dir(void)
{
    char err[512] = "";
    bt_safetensors_t *st = NULL;

    /* the golden directories hold one model.safetensors */
    BT_CHECK_MSG(bt_safetensors_open_dir(BT_GOLDEN_DIR "/golden-a", &st, err, sizeof err) == BT_OK,
                 "%s", err);
    BT_CHECK_EQ_INT(bt_safetensors_count(st), 495);
    bt_safetensors_close(st);
    st = NULL;

    /* an empty directory */
    BT_CHECK_EQ_INT(bt_safetensors_open_dir(tmp_dir, &st, err, sizeof err), BT_ERR_NOT_FOUND);

    /* two shards and an index */
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    uint8_t fp8[32 * 32], sc[1] = {128};
    for (int i = 0; i < 32 * 32; i++) fp8[i] = 0x38; /* 1.0 */
    bt_tensor_write_t s1[] = {{"x.weight", BT_DTYPE_F32, 2, {2, 2}, a},
                              {"q.weight", BT_DTYPE_F8_E4M3, 2, {32, 32}, fp8}};
    bt_tensor_write_t s2[] = {{"y.bias", BT_DTYPE_F32, 1, {2}, b},
                              {"q.scale", BT_DTYPE_F8_E8M0, 2, {1, 1}, sc}};
    BT_CHECK(bt_safetensors_write(tmp_path("model-00001-of-00002.safetensors"), s1, 2, err,
                                  sizeof err) == BT_OK);
    BT_CHECK(bt_safetensors_write(tmp_path("model-00002-of-00002.safetensors"), s2, 2, err,
                                  sizeof err) == BT_OK);
    write_index("{\"metadata\": {\"total_size\": 1064}, \"weight_map\": {"
                "\"x.weight\": \"model-00001-of-00002.safetensors\","
                "\"q.weight\": \"model-00001-of-00002.safetensors\","
                "\"y.bias\": \"model-00002-of-00002.safetensors\","
                "\"q.scale\": \"model-00002-of-00002.safetensors\"}}");
    BT_CHECK_MSG(bt_safetensors_open_dir(tmp_dir, &st, err, sizeof err) == BT_OK, "%s", err);
    if (st) {
        BT_CHECK_EQ_INT(bt_safetensors_count(st), 4);
        const bt_tensor_view_t *t = bt_safetensors_find(st, "y.bias");
        BT_CHECK(t && strstr(t->file, "model-00002-of-00002.safetensors"));
        t = bt_safetensors_find(st, "x.weight");
        BT_CHECK(t && strstr(t->file, "model-00001-of-00002.safetensors"));
        /* a quantized tensor whose scale lives in the other shard */
        float out[32 * 32];
        int64_t shape[2] = {32, 32};
        BT_CHECK_MSG(bt_safetensors_read_f32(st, "q.weight", 2, shape, out, err, sizeof err) ==
                         BT_OK, "%s", err);
        BT_CHECK(out[0] == 2.0f && out[32 * 32 - 1] == 2.0f);
        bt_safetensors_close(st);
        st = NULL;
    }

    /* bad indexes */
    static const struct {
        const char *json;
        const char *in_msg;
    } bad[] = {
        {"{\"weight_map\": {\"x.weight\": \"../model-00001-of-00002.safetensors\"}}", "plain"},
        {"{\"weight_map\": {\"x.weight\": \"sub/model-00001-of-00002.safetensors\"}}", "plain"},
        {"{\"weight_map\": {\"x.weight\": \"..\"}}", "plain"},
        {"{\"weight_map\": {\"x.weight\": \"\"}}", "plain"},
        {"{\"weight_map\": {\"x.weight\": 7}}", "x.weight"},
        {"{\"weight_map\": {\"x.weight\": \"gone.safetensors\"}}", "gone.safetensors"},
        {"{\"weight_map\": {\"y.bias\": \"model-00001-of-00002.safetensors\"}}", "y.bias"},
        {"{\"weight_map\": {\"nope\": \"model-00001-of-00002.safetensors\"}}", "nope"},
        {"{\"weights\": {}}", "weight_map"},
        {"{\"weight_map\": [", "index.json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_index(bad[i].json);
        err[0] = '\0';
        bt_status_t rc = bt_safetensors_open_dir(tmp_dir, &st, err, sizeof err);
        BT_CHECK_MSG(rc == BT_ERR_BAD_CHECKPOINT, "index %zu: %s (%s)", i, bt_status_name(rc), err);
        BT_CHECK_MSG(strstr(err, bad[i].in_msg) != NULL, "index %zu: '%s' lacks '%s'", i, err,
                     bad[i].in_msg);
    }
    /* a shard that is itself corrupt is named */
    write_raw(tmp_path("model-00002-of-00002.safetensors"), 2, "{]", 0);
    write_index("{\"weight_map\": {\"y.bias\": \"model-00002-of-00002.safetensors\"}}");
    BT_CHECK(bt_safetensors_open_dir(tmp_dir, &st, err, sizeof err) == BT_ERR_BAD_CHECKPOINT);
    BT_CHECK(strstr(err, "model-00002-of-00002.safetensors") != NULL);
    unlink(tmp_path("model.safetensors.index.json"));
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/bt_test_st_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    BT_RUN(test_open_golden);
    BT_RUN(test_golden_shapes);
    BT_RUN(test_golden_dequant);
    BT_RUN(test_write_round_trip);
    BT_RUN(test_write_rejects);
    BT_RUN(test_read_f32_errors);
    BT_RUN(test_corrupt_files);
    BT_RUN(test_open_dir);
    tmp_cleanup();
    return bt_test_summary();
}
