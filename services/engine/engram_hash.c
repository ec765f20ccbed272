#include "services/engine/engram_hash.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

__extension__ typedef unsigned __int128 u128;

/* ---- numpy SeedSequence (pool of 4 uint32 words) ---------------------------------------- */

#define SS_POOL 4
#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u
#define SS_XSHIFT 16

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const)
{
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y)
{
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> SS_XSHIFT);
}

/* The entropy pool of SeedSequence(seed) for a non-negative integer seed: the seed as
 * uint32 words, least significant first ([0] for 0), no spawn key. */
static void ss_pool(uint64_t seed, uint32_t pool[SS_POOL])
{
    uint32_t entropy[2];
    int n = 0;
    if (seed == 0) entropy[n++] = 0;
    for (uint64_t s = seed; s; s >>= 32) entropy[n++] = (uint32_t)s;

    uint32_t hc = SS_INIT_A;
    for (int i = 0; i < SS_POOL; i++) pool[i] = ss_hashmix(i < n ? entropy[i] : 0, &hc);
    for (int src = 0; src < SS_POOL; src++)
        for (int dst = 0; dst < SS_POOL; dst++)
            if (src != dst) pool[dst] = ss_mix(pool[dst], ss_hashmix(pool[src], &hc));
    for (int src = SS_POOL; src < n; src++) /* entropy longer than the pool */
        for (int dst = 0; dst < SS_POOL; dst++)
            pool[dst] = ss_mix(pool[dst], ss_hashmix(entropy[src], &hc));
}

void bt__seed_sequence_state(uint64_t seed, int n_words, uint32_t *out)
{
    uint32_t pool[SS_POOL];
    ss_pool(seed, pool);
    uint32_t hc = SS_INIT_B;
    for (int i = 0; i < n_words; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hc;
        hc *= SS_MULT_B;
        v *= hc;
        v ^= v >> SS_XSHIFT;
        out[i] = v;
    }
}

/* ---- PCG64 (XSL-RR 128/64) -------------------------------------------------------------- */

#define PCG_MULT_HI 0x2360ED051FC65DA4ull
#define PCG_MULT_LO 0x4385DF649FCCF645ull

static u128 u128_of(uint64_t hi, uint64_t lo)
{
    return ((u128)hi << 64) | lo;
}

static void pcg_store(bt__pcg64_t *g, u128 state, u128 inc)
{
    g->state_hi = (uint64_t)(state >> 64);
    g->state_lo = (uint64_t)state;
    g->inc_hi = (uint64_t)(inc >> 64);
    g->inc_lo = (uint64_t)inc;
}

static u128 pcg_step(u128 state, u128 inc)
{
    return state * u128_of(PCG_MULT_HI, PCG_MULT_LO) + inc;
}

void bt__pcg64_seed(bt__pcg64_t *g, uint64_t seed)
{
    /* PCG64: generate_state(4, uint64) = 8 uint32 words paired little-endian;
     * words 0-1 are the initial state, 2-3 the stream selector (high half first). */
    uint32_t w[8];
    bt__seed_sequence_state(seed, 8, w);
    uint64_t v[4];
    for (int i = 0; i < 4; i++) v[i] = (uint64_t)w[2 * i] | ((uint64_t)w[2 * i + 1] << 32);
    u128 initstate = u128_of(v[0], v[1]);
    u128 initseq = u128_of(v[2], v[3]);
    u128 inc = (initseq << 1) | 1u;
    u128 state = pcg_step(0, inc);
    state += initstate;
    state = pcg_step(state, inc);
    pcg_store(g, state, inc);
    g->has_uint32 = 0;
    g->uinteger = 0;
}

uint64_t bt__pcg64_next64(bt__pcg64_t *g)
{
    u128 inc = u128_of(g->inc_hi, g->inc_lo);
    u128 state = pcg_step(u128_of(g->state_hi, g->state_lo), inc);
    pcg_store(g, state, inc);
    uint64_t hi = (uint64_t)(state >> 64), lo = (uint64_t)state;
    unsigned rot = (unsigned)(hi >> 58);
    uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t bt__pcg64_next32(bt__pcg64_t *g)
{
    if (g->has_uint32) {
        g->has_uint32 = 0;
        return g->uinteger;
    }
    uint64_t next = bt__pcg64_next64(g);
    g->has_uint32 = 1;
    g->uinteger = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

double bt__pcg64_random(bt__pcg64_t *g)
{
    return (double)(bt__pcg64_next64(g) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- numpy bounded integers (Lemire, unmasked: Generator.integers' default) ------------- */

/* Uniform in [0, rng] for 0 < rng < 0xFFFFFFFF, from 32-bit draws. */
static uint32_t bounded_u32(bt__pcg64_t *g, uint32_t rng)
{
    uint32_t excl = rng + 1;
    uint64_t m = (uint64_t)bt__pcg64_next32(g) * excl;
    uint32_t left = (uint32_t)m;
    if (left < excl) {
        uint32_t threshold = (UINT32_MAX - rng) % excl;
        while (left < threshold) {
            m = (uint64_t)bt__pcg64_next32(g) * excl;
            left = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

/* Uniform in [0, rng] for 0xFFFFFFFF < rng < 2^64 - 1, from 64-bit draws. */
static uint64_t bounded_u64(bt__pcg64_t *g, uint64_t rng)
{
    uint64_t excl = rng + 1;
    u128 m = (u128)bt__pcg64_next64(g) * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
        uint64_t threshold = (UINT64_MAX - rng) % excl;
        while (left < threshold) {
            m = (u128)bt__pcg64_next64(g) * excl;
            left = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

void bt__pcg64_integers(bt__pcg64_t *g, int64_t low, int64_t high, int n, int64_t *out)
{
    /* numpy: rng = high - 1 - low (inclusive span), off = low, wrapping in uint64 */
    uint64_t rng = (uint64_t)high - 1u - (uint64_t)low;
    uint64_t off = (uint64_t)low;
    for (int i = 0; i < n; i++) {
        uint64_t v;
        if (rng == 0)
            v = 0;
        else if (rng < 0xFFFFFFFFull)
            v = bounded_u32(g, (uint32_t)rng);
        else if (rng == 0xFFFFFFFFull) /* current numpy: a plain 32-bit word (Lemire's excl wraps) */
            v = bt__pcg64_next32(g);
        else if (rng == UINT64_MAX)
            v = bt__pcg64_next64(g);
        else
            v = bounded_u64(g, rng);
        out[i] = (int64_t)(off + v);
    }
}

void bt_numpy_rng_integers(uint64_t seed, int64_t high, int n, int64_t *out)
{
    if (high < 1) {
        for (int i = 0; i < n; i++) out[i] = 0;
        return;
    }
    bt__pcg64_t g;
    bt__pcg64_seed(&g, seed);
    bt__pcg64_integers(&g, 0, high, n, out);
}

/* ---- primes ------------------------------------------------------------------------------ */

static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m)
{
    return (uint64_t)((u128)a * b % m);
}

static uint64_t powmod(uint64_t b, uint64_t e, uint64_t m)
{
    uint64_t r = 1 % m;
    b %= m;
    while (e) {
        if (e & 1) r = mulmod(r, b, m);
        b = mulmod(b, b, m);
        e >>= 1;
    }
    return r;
}

int bt__is_prime_u64(uint64_t n)
{
    /* The first 12 primes as witnesses decide every n < 3.3e24. */
    static const uint64_t bases[12] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
    if (n < 2) return 0;
    for (int i = 0; i < 12; i++) {
        if (n == bases[i]) return 1;
        if (n % bases[i] == 0) return 0;
    }
    uint64_t d = n - 1;
    int s = 0;
    while (!(d & 1)) {
        d >>= 1;
        s++;
    }
    for (int i = 0; i < 12; i++) {
        uint64_t x = powmod(bases[i], d, n);
        if (x == 1 || x == n - 1) continue;
        int composite = 1;
        for (int r = 1; r < s; r++) {
            x = mulmod(x, x, n);
            if (x == n - 1) {
                composite = 0;
                break;
            }
        }
        if (composite) return 0;
    }
    return 1;
}

/* ---- engram constants -------------------------------------------------------------------- */

bt_status_t bt_engram_constants(const int *layer_ids, int n_layers, int max_ngram, int n_heads,
                                int64_t engram_vocab_size, int64_t compressed_vocab_size,
                                int64_t *primes, int64_t *offsets, int64_t *multipliers)
{
    if (n_layers < 0 || max_ngram < 2 || n_heads < 1 || engram_vocab_size < 1 ||
        compressed_vocab_size < 1 || (n_layers && (!layer_ids || !primes || !offsets ||
                                                   !multipliers)))
        return BT_ERR_INVALID_ARG;
    for (int l = 0; l < n_layers; l++)
        if (layer_ids[l] < 0) return BT_ERR_INVALID_ARG;
    size_t per_layer = (size_t)(max_ngram - 1) * (size_t)n_heads;
    size_t total;
    if (bt_mul_overflows(per_layer, (size_t)n_layers, &total) || total > (size_t)INT32_MAX)
        return BT_ERR_INVALID_ARG;

    /* Primes first, into scratch, so nothing is written on failure. */
    uint64_t *drawn = bt_malloc_or_die((total ? total : 1) * sizeof *drawn);
    bt_status_t rc = BT_OK;
    size_t n_drawn = 0;
    for (int l = 0; l < n_layers && rc == BT_OK; l++) {
        for (int k = 0; k < max_ngram - 1 && rc == BT_OK; k++) {
            uint64_t current = (uint64_t)engram_vocab_size - 1;
            for (int h = 0; h < n_heads; h++) {
                /* next prime above `current` that no earlier (layer, n-gram, head) took */
                uint64_t c = current;
                for (;;) {
                    if (c >= (uint64_t)INT64_MAX) {
                        rc = BT_ERR_INVALID_ARG;
                        break;
                    }
                    c++;
                    int seen = 0;
                    for (size_t j = 0; j < n_drawn && !seen; j++) seen = drawn[j] == c;
                    if (!seen && bt__is_prime_u64(c)) break;
                }
                if (rc != BT_OK) break;
                drawn[n_drawn++] = c;
                current = c;
            }
        }
    }
    /* Offsets: per layer, running sums over the flat (n-gram, head) order. */
    for (int l = 0; l < n_layers && rc == BT_OK; l++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < per_layer; i++) {
            if (sum > (uint64_t)INT64_MAX - drawn[l * per_layer + i]) rc = BT_ERR_INVALID_ARG;
            sum += drawn[l * per_layer + i];
        }
    }
    if (rc != BT_OK) goto out;

    for (int l = 0; l < n_layers; l++) {
        uint64_t sum = 0;
        for (size_t i = 0; i < per_layer; i++) {
            primes[l * per_layer + i] = (int64_t)drawn[l * per_layer + i];
            offsets[l * per_layer + i] = (int64_t)sum;
            sum += drawn[l * per_layer + i];
        }
    }
    int64_t bound = (INT64_MAX / compressed_vocab_size) / 2;
    if (bound < 1) bound = 1;
    for (int l = 0; l < n_layers; l++) {
        int64_t *m = multipliers + (size_t)l * (size_t)max_ngram;
        bt_numpy_rng_integers(10007u * (uint64_t)layer_ids[l], bound, max_ngram, m);
        for (int k = 0; k < max_ngram; k++) m[k] = m[k] * 2 + 1;
    }
out:
    free(drawn);
    return rc;
}
