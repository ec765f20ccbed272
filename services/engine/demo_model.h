/* Baton's own tiny DeepSeek-V4.1 checkpoints: deterministic random (untrained) weights in
 * the published layout and storage formats (FP8 e4m3 + UE8M0 32x32 block scales, packed FP4
 * experts, BF16 norms and embeddings, F32 mHC), a byte-level tokenizer.json with the model's
 * special tokens, and a config.json that turns every mechanism on.
 *
 *   bt_demo_model_write(dir, "demo", err, sizeof err);    // what `baton` uses by default
 *   bt_demo_model_write(dir, "demo2", err, sizeof err);   // a second shape, float32 storage
 *   bt_demo_model_default_dir(buf, sizeof buf);            // ~/.cache/baton/demo-<version>
 *   bt_demo_model_ensure(buf, err, sizeof err);             // writes it when missing
 */
#ifndef BT_ENGINE_DEMO_MODEL_H
#define BT_ENGINE_DEMO_MODEL_H

#include "common/status.h"

#include <stddef.h>

/* Variants: "demo" (QAT shapes, quantized storage) and "demo2" (odd shapes, float32). */
bt_status_t bt_demo_model_write(const char *dir, const char *variant, char *err, size_t errlen);

/* The directory the CLI and services use when no --model-path is given. */
void bt_demo_model_default_dir(char *buf, size_t len);

/* Writes the "demo" variant into dir unless a complete one is already there. */
bt_status_t bt_demo_model_ensure(const char *dir, char *err, size_t errlen);

/* Both: the default directory into buf, the model written there when missing (what every
 * command and service without a --model-path does). */
bt_status_t bt_demo_model_default(char *buf, size_t len, char *err, size_t errlen);

#endif
