#include "services/common/worker_flags.h"

#include "common/log.h"
#include "services/engine/model.h"

#include <stdio.h>
#include <string.h>

bt_worker_flags_t bt_worker_flags_default(void)
{
    bt_worker_flags_t w;
    memset(&w, 0, sizeof w);
    w.host = "127.0.0.1";
    w.ucx_tls = "tcp";
    w.transfer = "ucx";
    w.log_level = "info";
    w.tp = 1;
    w.nnodes = 1;
    w.watchdog_s = 300.0;
    w.drain_s = 30.0;
    w.device = "cpu";
    w.dtype = "auto";
    w.act_quant = "none";
    return w;
}

bool bt_worker_flags_check(const bt_worker_flags_t *w, bool simulate, char *err, size_t errlen)
{
    const char *bad = NULL;
    if (bt_log_level_parse(w->log_level) < 0) bad = "--log-level must be debug, info, warn or error";
    else if (w->tp < 1 || w->tp > 64) bad = "--tp must be 1..64";
    else if (w->node_rank < 0 || w->node_rank >= w->tp) bad = "--node-rank must be below --tp";
    else if (w->nnodes < 1) bad = "--nnodes must be at least 1";
    else if (w->tp > 1 && !w->dist_addr) bad = "--dist-init-addr is required when --tp > 1";
    else if (w->tp > 1 && simulate) bad = "--simulate runs with --tp 1 only";
    /* a millisecond at least (0 ms would mean no deadline at all, and no quarantine), and
     * within the int milliseconds the group's sockets take */
    else if (!(w->watchdog_s >= 0.001 && w->watchdog_s <= 2e6))
        bad = "--watchdog-timeout must be 0.001..2000000 seconds";
    else if (!(w->drain_s >= 0.0 && w->drain_s <= 2e6))
        bad = "--drain-timeout must be 0..2000000 seconds";
    else if (strcmp(w->transfer, "ucx") != 0) bad = "--transfer must be ucx";
    else if (w->port < 0 || w->port > 65535 || w->metrics_port < 0 || w->metrics_port > 65535)
        bad = "--port and --metrics-port must be 0..65535";
    else if (bt_device_parse(w->device) < 0) bad = "--device must be cpu or cuda";
    else if (bt_device_parse(w->device) == BT_DEVICE_CUDA && !bt_device_cuda_built())
        bad = "--device cuda: this build has no CUDA backend (configure with -DBT_CUDA=ON where the CUDA toolkit is)";
    else if (w->gpu < 0) bad = "--base-gpu-id must be 0 or more";
    else if (bt_weights_parse(w->dtype) < 0)
        bad = "--dtype must be auto (weights as stored), float32 or bfloat16";
    else if (bt_act_quant_parse(w->act_quant) < 0)
        bad = "--activation-quant must be none or fp8";
    else if (w->spec_algo && strcmp(w->spec_algo, "DSPARK") && strcmp(w->spec_algo, "NONE"))
        bad = "--speculative-algorithm must be DSPARK or NONE";
    else if (!(w->spec_conf >= 0.0 && w->spec_conf <= 1.0))
        bad = "--speculative-dspark-confidence must be 0..1";
    else if (w->spec_block < 0 || w->spec_block > BT_MAX_DRAFT_BLOCK)
        bad = "--speculative-dspark-block-size must be 1..16 (0: the checkpoint's)";
    if (bad) snprintf(err, errlen, "%s", bad);
    return bad == NULL;
}

bool bt_worker_flags_draft(const bt_worker_flags_t *w, bool simulate)
{
    return !simulate && w->spec_algo && !strcmp(w->spec_algo, "DSPARK");
}

bt_service_device_t bt_worker_flags_device(const bt_worker_flags_t *w, bool simulate)
{
    bt_service_device_t d = {
        bt_device_parse(w->device),           (int)w->gpu,        bt_weights_parse(w->dtype),
        bt_worker_flags_draft(w, simulate),   (int)w->spec_block, (float)w->spec_conf,
        bt_act_quant_parse(w->act_quant) == 1};
    return d;
}
