#include "services/common/sim.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

bt_sim_t bt_sim_default(void)
{
    return (bt_sim_t){false, 5000.0, 10.0, 2.2, 0.02};
}

bool bt_sim_valid(const bt_sim_t *sim, char *err, size_t errlen)
{
    if (sim->prefill_tokens_per_s <= 0 || sim->prefill_tokens_per_s > 1e9 || sim->step_ms_base < 0 ||
        sim->step_ms_per_seq < 0 || sim->step_ms_per_kctx < 0 || sim->step_ms_base > 60000) {
        snprintf(err, errlen, "--sim-prefill-tokens-per-s must be in (0, 1e9], the --sim-decode-step-ms-* "
                              "values >= 0 (base at most 60000)");
        return false;
    }
    return true;
}

double bt_sim_prefill_ms(const bt_sim_t *sim, int n_tokens)
{
    return 1000.0 * (double)n_tokens / sim->prefill_tokens_per_s;
}

double bt_sim_step_ms(const bt_sim_t *sim, int n_seqs, int64_t ctx_tokens)
{
    return sim->step_ms_base + (double)n_seqs * sim->step_ms_per_seq +
           (double)ctx_tokens / 1000.0 * sim->step_ms_per_kctx;
}

void bt_sim_sleep_ms(double ms)
{
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000.0), (long)((ms - 1000.0 * (double)(time_t)(ms / 1000.0)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t bt_sim_key(const int32_t *ids, size_t n, uint64_t seed)
{
    uint64_t h = 0xcbf29ce484222325ull ^ mix(seed);
    for (size_t i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 0x100000001b3ull;
    return mix(h);
}

int32_t bt_sim_token(uint64_t key, int64_t position, int vocab, int eos_id)
{
    if (vocab < 2) return 0;
    int32_t t = (int32_t)(mix(key + (uint64_t)position * 0x9e3779b97f4a7c15ull) % (uint64_t)vocab);
    if (t == eos_id) t = (t + 1) % vocab;
    return t;
}
