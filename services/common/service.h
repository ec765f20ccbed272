/* What every Baton service process shares: the engine opened from flags (model, tokenizer
 * token map, KV layout), registration with the router and heartbeats, signal handling.
 *
 *   bt_service_engine_t eng;
 *   bt_service_engine_open(model_path, context_length, max_batch, threads, &eng, err, n);
 *   bt_registration_t *reg;
 *   bt_registration_start(rpc, router_addr, &info, stats_fn, ctx, &reg);   // heartbeats
 *   bt_service_on_signal(loop, on_stop, ctx);                            // SIGINT/SIGTERM
 */
#ifndef BT_SERVICES_SERVICE_H
#define BT_SERVICES_SERVICE_H

#include "common/rpc/rpc.h"
#include "services/common/proto_util.h"
#include "services/engine/model.h"
#include "services/engine/sampler.h"

#include <stdbool.h>
#include <uv.h>

typedef struct {
    bt_model_t *model;
    bt_kv_layout_t layout;
    const bt_model_config_t *cfg;
    uint64_t compat_hash;
    int emit_vocab; /* the ids a sampler may pick: the tokenizer's, at most cfg->vocab (0: all) */
    char model_dir[4096];
    char served_name[256];
    bt_model_config_t sim_cfg; /* the config when no model is loaded (simulated workers) */
    struct bt_grammar_vocab *grammar_vocab; /* for constrained decoding, made on first use */
} bt_service_engine_t;

/* The ids the engine's samplers pick from: a model's padding rows past its tokenizer's ids are
 * never sampled (text could not carry them: the router's detokenizer refuses them). */
static inline int bt_service_emit_vocab(const bt_service_engine_t *e)
{
    return e->emit_vocab > 0 ? e->emit_vocab : e->cfg->vocab;
}

/* model_path NULL = the demo model (written on first use). max_batch_seqs bounds one
 * forward's sequences, max_batch_tokens its tokens. */
struct bt_comm;
/* Where the model runs (services/engine/model.h): device BT_DEVICE_CPU or BT_DEVICE_CUDA on
 * GPU gpu, weights in BT_WEIGHTS_* format (--dtype). */
typedef struct {
    int device, gpu, weights;
    bool draft;             /* the DSpark draft stages (speculative decoding) */
    int draft_block;        /* proposals a step: 0 = the checkpoint's block, else at most that */
    float draft_confidence; /* verify up to the first proposal the draft doubts
                               (bt_spec_set_confidence) */
    bool activation_quant;  /* --activation-quant fp8 (bt_model_options_t.activation_quant) */
} bt_service_device_t;

/* XORed into the KV compatibility hash of a group that quantizes activations: its KV states
 * are another forward's, so groups that differ refuse each other's */
#define BT_AQ_COMPAT_MARKER 0x4143545f51464538ull /* "ACT_QFE8" */

/* The same as one rank of a tensor-parallel group: the model keeps its shard (comm may be
 * NULL for TP 1) and the compatibility hash carries the TP size. dev NULL: the CPU. */
bt_status_t bt_service_engine_open_tp(const char *model_path, const char *served_name,
                                      int64_t context_length, int max_batch_seqs,
                                      int max_batch_tokens, int threads, struct bt_comm *comm,
                                      const bt_service_device_t *dev, bt_service_engine_t *eng, char *err, size_t errlen);
bt_status_t bt_service_engine_open(const char *model_path, const char *served_name,
                                   int64_t context_length, int max_batch_seqs,
                                   int max_batch_tokens, int threads, bt_service_engine_t *eng,
                                   char *err, size_t errlen);
/* The same without weights (model stays NULL): config, KV layout and a compat hash that
 * pairs only with other simulated groups (services/common/sim.h). */
bt_status_t bt_service_engine_open_sim(const char *model_path, const char *served_name,
                                       int64_t context_length, bt_service_engine_t *eng,
                                       char *err, size_t errlen);
void bt_service_engine_close(bt_service_engine_t *eng);

/* A request's constrained decoding (sampling.response_format: common/text/grammar.h) into
 * *g_p, NULL when it asks for none; the vocabulary's trie is made on the first (from the model's
 * tokenizer, over the ids the engine samples). BT_ERR_INVALID_ARG with err naming the problem. */
struct bt_grammar;
bt_status_t bt_service_grammar(bt_service_engine_t *eng, const Baton__V1__SamplingParams *sp,
                               struct bt_grammar **g_p, char *err, size_t errlen);

/* Load figures a worker reports with each heartbeat. */
typedef void (*bt_load_fn)(void *ctx, Baton__V1__HeartbeatRequest *hb);

typedef struct bt_registration bt_registration_t;

/* Registers `info` with the router at router_addr and heartbeats; re-registers when the
 * router forgets the worker or was unreachable. Never blocks. */
bt_status_t bt_registration_start(bt_rpc_t *rpc, const char *router_addr,
                                  const Baton__V1__WorkerInfo *info, bt_load_fn load, void *ctx,
                                  bt_registration_t **reg_p);
void bt_registration_stop(bt_registration_t *reg);
/* Tells the router the worker is leaving: it sends nothing new here from then on, and the
 * heartbeats go on, marked so (a worker that finishes its requests must not be dropped as
 * dead meanwhile), until bt_registration_stop. Calls on_left at once when not registered,
 * else once the router answered, or within a second when it does not. */
void bt_registration_leave(bt_registration_t *reg, void (*on_left)(void *ctx), void *ctx);

/* Calls on_stop once on SIGINT or SIGTERM. */
void bt_service_on_signal(uv_loop_t *loop, void (*on_stop)(void *ctx), void *ctx);

/* Milliseconds on the monotonic clock. */
int64_t bt_now_ms(void);

#endif
