/* The flags every worker group process takes (prefill and decode), SGLang's names:
 *
 *   bt_worker_flags_t w = bt_worker_flags_default();
 *   bt_flag_t spec[] = { BT_WORKER_FLAGS(&w), BT_FLAG_INT("chunked-prefill-size", ...), ... };
 *   ... bt_flags_parse ...
 *   if (!bt_worker_flags_check(&w, simulate, err, sizeof err)) -> usage error naming the flag
 */
#ifndef BT_SERVICES_WORKER_FLAGS_H
#define BT_SERVICES_WORKER_FLAGS_H

#include "common/flags.h"
#include "services/common/service.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *model_path, *served, *host, *router, *ucx_tls, *transfer, *log_level, *net_devices;
    const char *dist_addr, *device, *dtype, *spec_algo, *act_quant;
    int64_t port, context, threads, tp, node_rank, nnodes, seed, metrics_port, gpu, spec_block;
    double watchdog_s, drain_s, spec_conf;
} bt_worker_flags_t;

bt_worker_flags_t bt_worker_flags_default(void);

#define BT_WORKER_FLAGS(w)                                                                         \
    BT_FLAG_STR("model-path", &(w)->model_path, "checkpoint directory (default: the demo model)"), \
        BT_FLAG_STR("served-model-name", &(w)->served, "model name reported to the router"),       \
        BT_FLAG_STR("host", &(w)->host, "address to listen on (default 127.0.0.1)"),               \
        BT_FLAG_INT("port", &(w)->port, "gRPC port (0 picks one)"),                                \
        BT_FLAG_STR("router", &(w)->router, "router address host:port to register with"),          \
        BT_FLAG_INT(                                                                               \
            "context-length", &(w)->context,                                                       \
            "tokens per sequence (default: min(model, 8192); prefill and decode must agree)"),     \
        BT_FLAG_FLOAT("watchdog-timeout", &(w)->watchdog_s,                                        \
                      "seconds any wait may take (default 300)"),                                  \
        BT_FLAG_FLOAT("drain-timeout", &(w)->drain_s,                                              \
                      "seconds a stopping group finishes its requests in (default 30)"),           \
        BT_FLAG_INT("threads", &(w)->threads,                                                      \
                    "CPU threads for the model (default: one per core)"),                          \
        BT_FLAG_STR("device", &(w)->device, "where the model runs: cpu (default) or cuda"),        \
        BT_FLAG_INT("base-gpu-id", &(w)->gpu, "the GPU of --device cuda (default 0)"),             \
        BT_FLAG_STR("dtype", &(w)->dtype, "cuda weights: auto (as stored), float32, bfloat16"),    \
        BT_FLAG_STR(                                                                               \
            "activation-quant", &(w)->act_quant,                                                   \
            "none (default) or fp8: the reference deployment's activation rounding (must agree)"), \
        BT_FLAG_INT("tp", &(w)->tp, "tensor-parallel size: processes in this group (default 1)"),  \
        BT_FLAG_INT("node-rank", &(w)->node_rank, "this process's rank in the group (0 leads)"),   \
        BT_FLAG_INT("nnodes", &(w)->nnodes,                                                        \
                    "hosts the group spans (one process per rank either way)"),                    \
        BT_FLAG_STR("dist-init-addr", &(w)->dist_addr,                                             \
                    "host:port where rank 0 meets the other ranks"),                               \
        BT_FLAG_INT("random-seed", &(w)->seed, "accepted for SGLang compatibility"),               \
        BT_FLAG_STR("transfer", &(w)->transfer, "KV transport: ucx (default)"),                    \
        BT_FLAG_STR("ucx-tls", &(w)->ucx_tls, "UCX transports: tcp (default), sm, tcp,sm"),        \
        BT_FLAG_STR("ucx-net-devices", &(w)->net_devices, "UCX_NET_DEVICES (e.g. lo, mlx5_0:1)"),  \
        BT_FLAG_INT("metrics-port", &(w)->metrics_port, "HTTP port of /metrics (0 picks one)"),    \
        BT_FLAG_STR("speculative-algorithm", &(w)->spec_algo,                                      \
                    "DSPARK: the checkpoint's draft stages (prefill and decode must agree)"),      \
        BT_FLAG_INT("speculative-dspark-block-size", &(w)->spec_block,                             \
                    "DSpark proposals a step: the checkpoint's block size, or fewer"),             \
        BT_FLAG_FLOAT(                                                                             \
            "speculative-dspark-confidence", &(w)->spec_conf,                                      \
            "verify DSpark proposals up to the first the draft trusts less (0..1, default 0)"),    \
        BT_FLAG_STR("log-level", &(w)->log_level, "debug, info, warn, error")

/* Checks the shared flags; on failure writes a message naming the flag. */
bool bt_worker_flags_check(const bt_worker_flags_t *w, bool simulate, char *err, size_t errlen);

/* The model's device from --device, --base-gpu-id and --dtype (checked flags), and whether
 * it runs the draft stages (--speculative-algorithm DSPARK, not under --simulate). */
bt_service_device_t bt_worker_flags_device(const bt_worker_flags_t *w, bool simulate);
bool bt_worker_flags_draft(const bt_worker_flags_t *w, bool simulate);

#endif
