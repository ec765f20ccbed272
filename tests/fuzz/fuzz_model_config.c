/* libFuzzer target: config.json parsing (a checkpoint's config comes from outside). */
#include "services/engine/config.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bt_model_config_t cfg;
    char err[512];
    if (bt_model_config_parse((const char *)data, size, &cfg, err, sizeof err) == BT_OK) {
        /* a config that parses must give sane derived values */
        float inv[1024];
        if (cfg.rope_main.rope_dim <= 2048 && cfg.rope_compress.rope_dim <= 2048) {
            bt_rope_inv_freq(&cfg.rope_main, inv);
            bt_rope_inv_freq(&cfg.rope_compress, inv);
        }
    }
    return 0;
}
