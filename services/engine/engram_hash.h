/* The constants of DeepSeek-V4.1's engram n-gram hash, bit-exact with the reference
 * (transformers deepseek_v41 `EngramLayout` / `compute_hash_multipliers`):
 *   - bucket moduli: for every engram layer, n-gram size 2..max_ngram and head, the next
 *     prime above engram_vocab_size - 1 not drawn before (primes are never reused);
 *   - bucket offsets: per layer, prefix sums of that layer's primes in (n-gram, head) order;
 *   - hash multipliers: numpy `default_rng(10007 * layer_id).integers(0, bound, max_ngram)`
 *     * 2 + 1 with bound = max(1, (INT64_MAX // compressed_vocab_size) // 2).
 * The multipliers need numpy's generator exactly, so this module carries a small
 * reimplementation of numpy's SeedSequence, PCG64 and bounded-integer sampling.
 *
 *   int64_t primes[2 * 3 * 8], offsets[2 * 3 * 8], mult[2 * 4];
 *   int layers[2] = {1, 14};
 *   bt_engram_constants(layers, 2, 4, 8, 16000000, 99092, primes, offsets, mult);
 */
#ifndef BT_ENGINE_ENGRAM_HASH_H
#define BT_ENGINE_ENGRAM_HASH_H

#include "common/status.h"

#include <stdint.h>

/* numpy: np.random.default_rng(seed).integers(low=0, high=high, size=n, dtype=np.int64).
 * high >= 1 (numpy raises otherwise; here high < 1 fills zeros). */
void bt_numpy_rng_integers(uint64_t seed, int64_t high, int n, int64_t *out);

/* Fills (all caller-allocated, row-major):
 *   primes      [n_layers][max_ngram - 1][n_heads]
 *   offsets     [n_layers][(max_ngram - 1) * n_heads]
 *   multipliers [n_layers][max_ngram]
 * BT_ERR_INVALID_ARG for max_ngram < 2, n_heads < 1, n_layers < 0, a negative layer id,
 * vocab sizes < 1, or constants that would not fit int64. Outputs written only on success. */
bt_status_t bt_engram_constants(const int *layer_ids, int n_layers, int max_ngram, int n_heads,
                                int64_t engram_vocab_size, int64_t compressed_vocab_size,
                                int64_t *primes, int64_t *offsets, int64_t *multipliers);

/* ---- internal, exposed for tests -------------------------------------------------------- */

/* numpy's Generator(PCG64(SeedSequence(seed))) state. */
typedef struct {
    uint64_t state_hi, state_lo; /* 128-bit LCG state */
    uint64_t inc_hi, inc_lo;     /* odd increment */
    int has_uint32;              /* next32 buffers the high half of a 64-bit draw */
    uint32_t uinteger;
} bt__pcg64_t;

void bt__pcg64_seed(bt__pcg64_t *g, uint64_t seed);
uint64_t bt__pcg64_next64(bt__pcg64_t *g);
uint32_t bt__pcg64_next32(bt__pcg64_t *g);
/* Generator.random(): a double in [0, 1) from the top 53 bits of next64. */
double bt__pcg64_random(bt__pcg64_t *g);
/* Generator.integers(low, high, size=n, dtype=np.int64), high exclusive, low < high. */
void bt__pcg64_integers(bt__pcg64_t *g, int64_t low, int64_t high, int n, int64_t *out);
/* numpy SeedSequence(seed).generate_state(n_words, np.uint32). */
void bt__seed_sequence_state(uint64_t seed, int n_words, uint32_t *out);
/* Deterministic Miller-Rabin, exact for every 64-bit n. */
int bt__is_prime_u64(uint64_t n);

#endif
