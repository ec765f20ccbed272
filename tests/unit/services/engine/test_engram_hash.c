#include "bt_test.h"

#include "common/json.h"
#include "services/engine/engram_hash.h"
#include "services/engine/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- numpy reference values ---------------------------------------------------------------- */

/* Values printed by numpy's own documentation examples of default_rng. */
static void test_numpy_doc_values(void)
{
    bt__pcg64_t g;
    int64_t v[5];

    /* np.random.default_rng(12345).random() -> 0.22733602246716966;
     * a fresh default_rng(12345).integers(low=0, high=10, size=3) -> [6, 2, 7] */
    bt__pcg64_seed(&g, 12345);
    BT_CHECK(bt__pcg64_random(&g) == 0.22733602246716966);
    bt_numpy_rng_integers(12345, 10, 3, v);
    BT_CHECK(v[0] == 6 && v[1] == 2 && v[2] == 7);

    /* np.random.default_rng(658).random() -> 0.13691146845619506;
     * a fresh default_rng(658).integers(low=0, high=10, size=5) -> [4, 1, 6, 0, 0] */
    bt__pcg64_seed(&g, 658);
    BT_CHECK(bt__pcg64_random(&g) == 0.13691146845619506);
    bt_numpy_rng_integers(658, 10, 5, v);
    BT_CHECK_MSG(v[0] == 4 && v[1] == 1 && v[2] == 6 && v[3] == 0 && v[4] == 0,
                 "%lld %lld %lld %lld %lld", (long long)v[0], (long long)v[1], (long long)v[2],
                 (long long)v[3], (long long)v[4]);

    /* np.random.default_rng(42).random(5) -> [0.77395605 0.43887844 0.85859792 0.69736803
     * 0.09417735] (printed to 8 digits) */
    static const double r42[5] = {0.77395605, 0.43887844, 0.85859792, 0.69736803, 0.09417735};
    bt__pcg64_seed(&g, 42);
    for (int i = 0; i < 5; i++) {
        double r = bt__pcg64_random(&g);
        BT_CHECK_MSG(fabs(r - r42[i]) < 5e-9, "%d: %.17g", i, r);
    }
}

/* Properties that hold whatever the stream: next32 halves a 64-bit draw, low half first;
 * the bounded draws stay in range; a span of one draws nothing. */
static void test_generator_properties(void)
{
    bt__pcg64_t a, b;
    bt__pcg64_seed(&a, 7);
    bt__pcg64_seed(&b, 7);
    uint64_t x = bt__pcg64_next64(&a);
    BT_CHECK(bt__pcg64_next32(&b) == (uint32_t)x);
    BT_CHECK(bt__pcg64_next32(&b) == (uint32_t)(x >> 32));
    BT_CHECK(bt__pcg64_next64(&a) == bt__pcg64_next64(&b));

    /* SeedSequence words differ for different seeds and seed 0 is valid */
    uint32_t s0[8], s1[8], s2[8];
    bt__seed_sequence_state(0, 8, s0);
    bt__seed_sequence_state(1, 8, s1);
    bt__seed_sequence_state((uint64_t)1 << 32, 8, s2); /* two entropy words */
    BT_CHECK(memcmp(s0, s1, sizeof s0) != 0 && memcmp(s1, s2, sizeof s1) != 0);

    int64_t v[1000];
    static const int64_t highs[] = {1, 2, 3, 10, 1000, 4294967295LL, 4294967296LL, 4294967297LL,
                                    (int64_t)1 << 40, INT64_MAX};
    for (size_t k = 0; k < sizeof highs / sizeof highs[0]; k++) {
        bt_numpy_rng_integers(99, highs[k], 1000, v);
        int bad = 0;
        for (int i = 0; i < 1000; i++) bad += v[i] < 0 || v[i] >= highs[k];
        BT_CHECK_MSG(bad == 0, "high %lld", (long long)highs[k]);
    }
    bt_numpy_rng_integers(5, 1, 3, v);
    BT_CHECK(v[0] == 0 && v[1] == 0 && v[2] == 0);
    /* low offset is added */
    bt__pcg64_seed(&a, 11);
    bt__pcg64_integers(&a, -5, 5, 1000, v);
    int bad = 0;
    for (int i = 0; i < 1000; i++) bad += v[i] < -5 || v[i] >= 5;
    BT_CHECK_EQ_INT(bad, 0);
}

static void test_primality(void)
{
    static const uint64_t primes[] = {2, 3, 5, 37, 41, 307, 7919, 2147483647ull,
                                      1000000007ull, 4294967291ull, 18446744073709551557ull};
    static const uint64_t composites[] = {0, 1, 4, 9, 561, 1105, 3215031751ull,
                                          /* strong pseudoprimes to several small bases */
                                          3825123056546413051ull,
                                          4294967297ull, 18446744073709551615ull};
    for (size_t i = 0; i < sizeof primes / sizeof primes[0]; i++)
        BT_CHECK_MSG(bt__is_prime_u64(primes[i]), "%llu", (unsigned long long)primes[i]);
    for (size_t i = 0; i < sizeof composites / sizeof composites[0]; i++)
        BT_CHECK_MSG(!bt__is_prime_u64(composites[i]), "%llu",
                     (unsigned long long)composites[i]);
    /* agrees with trial division below 20000 */
    int bad = 0;
    for (uint64_t n = 0; n < 20000; n++) {
        int p = n >= 2;
        for (uint64_t d = 2; d * d <= n && p; d++) p = n % d != 0;
        bad += p != bt__is_prime_u64(n);
    }
    BT_CHECK_EQ_INT(bad, 0);
}

/* ---- the golden fixtures ------------------------------------------------------------------- */

static int read_i64(const bt_safetensors_t *st, const char *name, int64_t *out, size_t n)
{
    const bt_tensor_view_t *t = bt_safetensors_find(st, name);
    if (!t || t->dtype != BT_DTYPE_I64 || t->nbytes != n * 8) return -1;
    memcpy(out, t->data, t->nbytes);
    return 0;
}

static void check_model(const char *model)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof path, "%s/%s/config.json", BT_GOLDEN_DIR, model);
    cJSON *root = NULL;
    BT_CHECK_MSG(bt_json_read_file(path, 1 << 20, &root, err, sizeof err) == BT_OK, "%s", err);
    if (!root) return;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    int64_t *layers64 = NULL, *num_emb = NULL;
    int n_layers = 0, n_emb = 0;
    int64_t max_ngram = 0, n_heads = 0, vocab = 0, cvocab = 0;
    BT_CHECK(bt_json_get_int_array(tc, "engram_layer_ids", &layers64, &n_layers, err,
                                   sizeof err) == BT_OK);
    BT_CHECK(bt_json_get_int_array(tc, "engram_num_embeddings", &num_emb, &n_emb, err,
                                   sizeof err) == BT_OK);
    BT_CHECK(bt_json_get_int(tc, "engram_max_ngram_size", &max_ngram, err, sizeof err) == BT_OK);
    BT_CHECK(bt_json_get_int(tc, "engram_n_heads", &n_heads, err, sizeof err) == BT_OK);
    BT_CHECK(bt_json_get_int(tc, "engram_vocab_size", &vocab, err, sizeof err) == BT_OK);
    BT_CHECK(bt_json_get_int(tc, "engram_compressed_vocab_size", &cvocab, err, sizeof err) ==
             BT_OK);
    cJSON_Delete(root);
    if (!layers64 || n_layers <= 0 || max_ngram < 2 || n_heads < 1) goto out;

    int layers[16];
    for (int i = 0; i < n_layers && i < 16; i++) layers[i] = (int)layers64[i];
    size_t nc = (size_t)n_layers * (size_t)(max_ngram - 1) * (size_t)n_heads;
    size_t nm = (size_t)n_layers * (size_t)max_ngram;
    int64_t *primes = calloc(nc, 8), *offsets = calloc(nc, 8), *mult = calloc(nm, 8);
    int64_t *g_primes = calloc(nc, 8), *g_offsets = calloc(nc, 8), *g_mult = calloc(nm, 8);
    BT_CHECK(bt_engram_constants(layers, n_layers, (int)max_ngram, (int)n_heads, vocab, cvocab,
                                 primes, offsets, mult) == BT_OK);

    snprintf(path, sizeof path, "%s/%s/golden.safetensors", BT_GOLDEN_DIR, model);
    bt_safetensors_t *st = NULL;
    BT_CHECK_MSG(bt_safetensors_open(path, &st, err, sizeof err) == BT_OK, "%s", err);
    if (st) {
        BT_CHECK(read_i64(st, "engram.primes", g_primes, nc) == 0);
        BT_CHECK(read_i64(st, "engram.offsets", g_offsets, nc) == 0);
        BT_CHECK(read_i64(st, "engram.multipliers", g_mult, nm) == 0);
        for (size_t i = 0; i < nc; i++) {
            BT_CHECK_MSG(primes[i] == g_primes[i], "%s primes[%zu]: %lld != %lld", model, i,
                         (long long)primes[i], (long long)g_primes[i]);
            BT_CHECK_MSG(offsets[i] == g_offsets[i], "%s offsets[%zu]: %lld != %lld", model, i,
                         (long long)offsets[i], (long long)g_offsets[i]);
        }
        for (size_t i = 0; i < nm; i++)
            BT_CHECK_MSG(mult[i] == g_mult[i], "%s multipliers[%zu]: %lld != %lld", model, i,
                         (long long)mult[i], (long long)g_mult[i]);
        bt_safetensors_close(st);
    }
    /* each layer's table has exactly the rows its buckets need */
    size_t per = (size_t)(max_ngram - 1) * (size_t)n_heads;
    for (int l = 0; l < n_layers && l < n_emb; l++)
        BT_CHECK(offsets[l * per + per - 1] + primes[l * per + per - 1] == num_emb[l]);

    free(primes);
    free(offsets);
    free(mult);
    free(g_primes);
    free(g_offsets);
    free(g_mult);
out:
    free(layers64);
    free(num_emb);
}

static void test_golden_constants(void)
{
    check_model("golden-a");
    check_model("golden-a-exact");
    check_model("golden-a-quant");
}

/* The released configuration: shapes and invariants (no reference values are stored). */
static void test_release_layout(void)
{
    int layers[2] = {1, 14};
    int64_t primes[2 * 3 * 8], offsets[2 * 3 * 8], mult[2 * 4];
    BT_CHECK(bt_engram_constants(layers, 2, 4, 8, 16000000, 99092, primes, offsets, mult) ==
             BT_OK);
    /* 48 consecutive primes above 16e6, increasing, offsets restarting per layer */
    BT_CHECK(primes[0] > 16000000 - 1);
    for (int i = 1; i < 48; i++) {
        BT_CHECK(primes[i] > primes[i - 1]);
        for (int64_t c = primes[i - 1] + 1; c < primes[i]; c++) BT_CHECK(!bt__is_prime_u64((uint64_t)c));
    }
    BT_CHECK(offsets[0] == 0 && offsets[24] == 0 && offsets[1] == primes[0]);
    int64_t bound = (INT64_MAX / 99092) / 2;
    for (int i = 0; i < 8; i++) BT_CHECK(mult[i] % 2 == 1 && mult[i] >= 1 && mult[i] < 2 * bound);
    /* the table sizes of the release: 384006168 and 384016682 rows */
    int64_t rows0 = offsets[23] + primes[23], rows1 = offsets[47] + primes[47];
    BT_CHECK_MSG(rows0 == 384006168 && rows1 == 384016682, "%lld %lld", (long long)rows0,
                 (long long)rows1);

    /* bad arguments */
    BT_CHECK(bt_engram_constants(layers, 2, 1, 8, 100, 10, primes, offsets, mult) ==
             BT_ERR_INVALID_ARG);
    BT_CHECK(bt_engram_constants(layers, 2, 4, 0, 100, 10, primes, offsets, mult) ==
             BT_ERR_INVALID_ARG);
    BT_CHECK(bt_engram_constants(layers, 2, 4, 8, 0, 10, primes, offsets, mult) ==
             BT_ERR_INVALID_ARG);
    int neg[1] = {-1};
    BT_CHECK(bt_engram_constants(neg, 1, 4, 8, 100, 10, primes, offsets, mult) ==
             BT_ERR_INVALID_ARG);
    /* a compressed vocab above INT64_MAX / 2: bound 1, every multiplier 1 */
    BT_CHECK(bt_engram_constants(layers, 1, 2, 1, 2, INT64_MAX, primes, offsets, mult) == BT_OK);
    BT_CHECK(mult[0] == 1 && mult[1] == 1 && primes[0] == 2);
    /* primes that would pass INT64_MAX */
    BT_CHECK(bt_engram_constants(layers, 1, 2, 2, INT64_MAX - 30, 10, primes, offsets, mult) ==
             BT_ERR_INVALID_ARG);
}

int main(void)
{
    BT_RUN(test_numpy_doc_values);
    BT_RUN(test_generator_properties);
    BT_RUN(test_primality);
    BT_RUN(test_golden_constants);
    BT_RUN(test_release_layout);
    return bt_test_summary();
}
