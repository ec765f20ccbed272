/* Simulated workers (`baton-prefill --simulate`, `baton-decode --simulate`): the whole real
 * path (registration, admission, KV slots from the pool, the UCX puts of real bytes and the
 * notices, streaming) with the model replaced by a timing model and deterministic
 * pseudo-random tokens. No weights are loaded: the KV layout comes from the model's config.
 *
 * Timing model (milliseconds):
 *   prefill chunk of n tokens:  1000 * n / prefill_tokens_per_s
 *   decode step of b sequences holding c context tokens in all:
 *                               step_ms_base + b * step_ms_per_seq + (c / 1000) * step_ms_per_kctx
 * The defaults roughly follow the reference deployment (about 5k prefill tok/s; 80 tok/s for
 * one stream, 350 tok/s aggregate for 16).
 *
 *   bt_sim_t sim = bt_sim_default();
 *   bt_flag_t spec[] = { ..., BT_SIM_FLAGS(&sim) };
 *   ... in the uv work callback: bt_sim_sleep_ms(bt_sim_step_ms(&sim, n, ctx));
 *   int32_t t = bt_sim_token(bt_sim_key(prompt, n_prompt, seed), position, vocab, eos_id);
 *
 * Simulated groups mix a marker into their compat hash, so they pair only with each other. */
#ifndef BT_SERVICES_SIM_H
#define BT_SERVICES_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    bool on;
    double prefill_tokens_per_s;
    double step_ms_base, step_ms_per_seq, step_ms_per_kctx;
} bt_sim_t;

#define BT_SIM_COMPAT_MARKER 0x53494d554c415445ull /* "SIMULATE" */

bt_sim_t bt_sim_default(void);

/* The flag entries shared by both workers (common/flags.h must be included). */
#define BT_SIM_FLAGS(s)                                                                            \
    BT_FLAG_BOOL("simulate", &(s)->on, "no model: timing model + pseudo-random tokens (sim.h)"),   \
        BT_FLAG_FLOAT("sim-prefill-tokens-per-s", &(s)->prefill_tokens_per_s,                      \
                      "simulated prefill speed (default 5000)"),                                   \
        BT_FLAG_FLOAT("sim-decode-step-ms-base", &(s)->step_ms_base,                               \
                      "simulated decode step: fixed part in ms (default 10)"),                     \
        BT_FLAG_FLOAT("sim-decode-step-ms-per-seq", &(s)->step_ms_per_seq,                         \
                      "simulated decode step: ms per sequence in the batch (default 2.2)"),        \
        BT_FLAG_FLOAT("sim-decode-step-ms-per-kctx", &(s)->step_ms_per_kctx,                       \
                      "simulated decode step: ms per 1000 context tokens in the batch (default 0.02)")

/* false (with a message) when a value is out of range. */
bool bt_sim_valid(const bt_sim_t *sim, char *err, size_t errlen);

double bt_sim_prefill_ms(const bt_sim_t *sim, int n_tokens);
double bt_sim_step_ms(const bt_sim_t *sim, int n_seqs, int64_t ctx_tokens);
void bt_sim_sleep_ms(double ms);

/* A per-request key (prompt and seed) and the token at a generated position: uniform over
 * the vocabulary, never eos_id. */
uint64_t bt_sim_key(const int32_t *ids, size_t n, uint64_t seed);
int32_t bt_sim_token(uint64_t key, int64_t position, int vocab, int eos_id);

#endif
