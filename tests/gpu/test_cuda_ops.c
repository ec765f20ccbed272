/* Every CUDA operator of kernels/cuda against the CPU reference, on fresh random inputs over
 * several shapes, odd sizes included. Relative error ||out - ref|| / ||ref|| must stay under a
 * bound set per dtype; a non-finite output never passes; outputs are poisoned (NaN bytes,
 * 0x7f7f7f7f for integers) before each checked run. Ops that work in place (rope, fake quant,
 * hc_expand, engram_inject) get their input copied in fresh instead.
 *
 * References: kernels/cpu (rmsnorm, rope, the fake quantizers, the number formats) where the
 * operator is a function there; for the per-token steps that are static in
 * services/engine/model.c, plain-C transcriptions of its loops below (ref_*).
 *
 *   test_cuda_ops                 the correctness table
 *   test_cuda_ops --perf          also the large cases, timed: events, warm-up, median
 *   test_cuda_ops --only topk,... only the cases of these ops
 *   test_cuda_ops --seed N        reproduce a run (the seed is printed) */
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/lowp_bits.h"
#include "services/engine/sampler.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the table -------------------------------------------------------------------------- */

typedef enum {
    OP_GEMM_BF16,   /* s: M N K */
    OP_GEMM_FP8,    /* s: M N K wide-scales */
    OP_GEMM_FP4,    /* s: experts N K rows tokens tiny-scales */
    OP_RMSNORM,     /* s: rows n weighted */
    OP_ROPE,        /* s: rows heads dim half inverse */
    OP_FAKE_QUANT,  /* s: rows n block kind special-values */
    OP_HC_MIX,      /* s: T hc D */
    OP_HC_COLLAPSE, /* s: T hc D */
    OP_HC_EXPAND,   /* s: T hc D */
    OP_ATTENTION,   /* s: T H dim half max-window max-selected (-1: sel_n, sel, comp_kv NULL) */
    OP_INDEX,       /* s: T heads dim n */
    OP_TOPK,        /* s: T n k ties */
    OP_MOE_ROUTE,   /* s: T E k */
    OP_SWIGLU,      /* s: rows I weighted */
    OP_ENGRAM_GATHER, /* s: T cols dim table-rows */
    OP_ENGRAM_INJECT, /* s: T hc D */
    OP_SAMPLE,      /* s: T V setting shape ld-pad (run_sample) */
    /* the device model's glue (engine_ops.cu) and its f32 GEMM */
    OP_GEMM_F32,    /* s: M N K x-pad y-pad */
    OP_EMBED,       /* s: T hc D V */
    OP_GATHER,      /* s: n width src-rows */
    OP_SCALE,       /* s: n */
    OP_MOE_COMBINE, /* s: T D K shared */
    OP_COMPRESS,    /* s: groups r dim */
    OP_BLOCK_MAX,   /* s: T n bs */
    OP_MASK_BLOCKS, /* s: T n bs kept */
    OP_TRIM_SEL,    /* s: T stride */
    OP_TO_BF16,     /* s: rows cols pad */
    OP_ATTENTION_WS, /* s: as OP_ATTENTION, keys split over blocks (flash-decoding) */
    OP_GEMM_FP4_LIST, /* s: as OP_GEMM_FP4, over the experts with rows only; s[5] 2: the list
                       * padded with -1 slots (and, as 1, some tiny scales) */
    OP_INDEX_SETS,  /* s: as OP_INDEX, every token its own key set (a decode batch) */
    OP_ATTENTION_TC, /* s: as OP_ATTENTION, on the tensor cores (bf16 MMAs) */
    OP_INDEX_TC,    /* s: as OP_INDEX, on the tensor cores; s[4] 1: q, keys not FP4-rounded */
    OP_INDEX_SETS_TC, /* s: as OP_INDEX_SETS, on the tensor cores; s[4] as OP_INDEX_TC */
    OP_DEQUANT_FP8, /* s: N K */
    OP_HC_MIX_WS,   /* s: as OP_HC_MIX, with the workspace (split over blocks for few tokens) */
    OP_MOE_GROUP,   /* s: N K E bad-id (1: one pick out of range) */
    OP_ATTENTION_TC_WS, /* s: as OP_ATTENTION_TC, keys split over blocks (flash-decoding) */
    OP_GEMM_FP8_BATCHED, /* s: batch M N K token-major (1: x [M][batch][K], y [M][batch][N],
                          * rows padded) */
    OP_HEAD_FINISH, /* s: rows heads dim norm half fq (fq: block * 4 + kind, 0 none) */
    OP_HC_MIX_COLLAPSE, /* s: T hc D: the mix and a collapse by other weights in 2 launches */
    OP_ATTENTION_BATCH, /* s: as OP_ATTENTION_WS, each token's keys in its own part of one pool
                         * (per-token offsets, every third token without compressed keys),
                         * split per token: also bit for bit as each token launched alone */
    OP_ATTENTION_TC_BATCH, /* s: as OP_ATTENTION_BATCH, on the tensor cores */
    OP_SCATTER,     /* s: n width dst-rows */
    OP_COPY_RANGES, /* s: copies max-bytes source-bytes */
    OP_LOGIT_ADJUST, /* s: rows V ld-pad adjustments (distinct (row, id) pairs) */
    OP_ATTENTION_FLASH, /* s: as OP_ATTENTION_TC through bt_cuda_attention_flash: keys bf16,
                         * q and out in the case's dtype (the model's prefill: f32) */
    OP_FP4_FRAG,    /* s: runs of 16 bytes: bt_cuda_fp4_to_frag against lowp_bits.h's host form */
    OP_LOGIT_MASK,  /* s: rows V ld-pad words-pad (constrained decoding's masks) */
    OP_HC_MEAN,     /* s: T hc D ld-pad weighted: bt_cuda_hc_collapse (DSpark's capture) */
    OP_ADD_ROWS,    /* s: rows width y-pad x-pad: bt_cuda_add_rows (DSpark's Markov bias) */
    OP_ACT_QUANT,   /* s: rows K x-pad x-bf16 y-bf16 mode (1: special values, 2: in place, 3: both):
                     * bt_cuda_act_quant (the activation quantization) */
    OP_ROUTER,      /* s: T E D: bt_cuda_moe_router_logits against the host, batch invariance,
                     * a relaunch */
    OP_HC_EC,       /* s: T hc D o-f32 no-norm: bt_cuda_hc_expand_collapse against the expand
                     * and the collapse launched apart, bit for bit */
    OP_FP4_SWIGLU,  /* s: E N K R T limit cap: bt_cuda_gemm_fp4_swiglu_list (I = N / 2) against
                     * bt_cuda_gemm_fp4_grouped_list then bt_cuda_swiglu, bit for bit, an
                     * expert at most cap rows (0: 16) */
    OP_EXPAND_MOE,  /* s: T hc D K shared: bt_cuda_hc_expand_moe against bt_cuda_moe_combine
                     * then bt_cuda_hc_expand, bit for bit */
    OP_FP8_QFINISH, /* s: M N K dim half kind: bt_cuda_gemm_fp8_qfinish against bt_cuda_gemm_fp8
                     * then bt_cuda_head_finish (no norm, blocks of 32), bit for bit */
} op_t;

static const char *op_names[] = {"gemm_bf16",  "gemm_fp8",     "gemm_fp4_grouped", "rmsnorm",
                                 "rope",       "fake_quant",   "hc_mix",           "hc_collapse",
                                 "hc_expand",  "attention",    "index_scores",     "topk",
                                 "moe_route",  "swiglu",       "engram_gather",    "engram_inject",
                                 "sample",     "gemm_f32",     "embed_streams",    "gather_rows",
                                 "scale",      "moe_combine",  "compress_pool",    "block_max",
                                 "mask_blocks", "trim_sel",   "to_bf16",          "attention_ws",
                                 "gemm_fp4_listed", "index_scores_sets", "attention_tc",
                                 "index_scores_tc", "index_sets_tc", "dequant_fp8", "hc_mix_ws", "moe_group",
                                 "attention_tc_ws", "gemm_fp8_batched", "head_finish", "hc_mix_collapse",
                                 "attention_batch", "attention_tc_batch", "scatter_rows",
                                 "copy_ranges", "logit_adjust", "attention_flash", "fp4_frag",
                                 "logit_mask", "hc_mean", "add_rows", "act_quant",
                                 "moe_router_logits", "hc_expand_collapse", "gemm_fp4_swiglu", "hc_expand_moe", "gemm_fp8_qfinish"};

typedef struct {
    op_t op;
    bt_cuda_dtype_t dt; /* the activation / output dtype under test */
    int s[7];
    int perf; /* 1: only with --perf (large; timed) */
} case_t;

#define F32 BT_CUDA_F32
#define BF16 BT_CUDA_BF16

static const case_t cases[] = {
    {OP_GEMM_BF16, F32, {1, 129, 64}, 0},
    {OP_GEMM_BF16, F32, {7, 333, 200}, 0},
    {OP_GEMM_BF16, BF16, {64, 512, 256}, 0},
    {OP_GEMM_BF16, F32, {100, 1000, 520}, 0},
    {OP_GEMM_BF16, BF16, {5, 77, 40}, 0},
    /* 16 and 11 rows against 1 and their first half (batch invariance) */
    {OP_GEMM_BF16, F32, {16, 1280, 5120}, 0},
    {OP_GEMM_BF16, BF16, {11, 4096, 1024}, 0},
    /* up to 16 rows, K in whole 32s: the few-row kernel (K sliced over clusters of 8, 8, 1;
     * 4 tiles a block; a partial tile) */
    {OP_GEMM_BF16, F32, {1, 384, 5120}, 0},
    {OP_GEMM_BF16, F32, {16, 64, 5120}, 0},
    {OP_GEMM_BF16, BF16, {3, 8470, 64}, 0},
    {OP_GEMM_BF16, F32, {2, 100, 96}, 0},
    {OP_GEMM_FP8, F32, {1, 96, 64}, 0},
    {OP_GEMM_FP8, F32, {3, 100, 200}, 0},
    {OP_GEMM_FP8, BF16, {16, 512, 1024}, 0},
    {OP_GEMM_FP8, F32, {17, 129, 96}, 0},
    {OP_GEMM_FP8, F32, {64, 256, 512}, 0},
    {OP_GEMM_FP8, BF16, {200, 300, 1000}, 0},
    {OP_GEMM_FP8, F32, {130, 1024, 2048}, 0},
    /* few rows, K whole 64-chunks: the tensor-core kernel for few rows (odd N, 1..16 rows) */
    {OP_GEMM_FP8, F32, {5, 33, 128}, 0},
    {OP_GEMM_FP8, BF16, {16, 1000, 320}, 0},
    {OP_GEMM_FP8, F32, {2, 40, 64}, 0},
    {OP_GEMM_FP8, F32, {11, 70, 1280}, 0},
    {OP_GEMM_FP8, BF16, {4, 8470, 128}, 0}, /* enough columns for 4 tiles a block */
    {OP_GEMM_FP8, F32, {3, 40000, 128}, 0},  /* more items than resident blocks */
    {OP_GEMM_FP8, BF16, {12, 20, 64}, 0},    /* rows 8..15 through the ring too */
    {OP_GEMM_FP8, F32, {3, 300, 1024, 1}, 0},   /* scales for both dequantization routes */
    /* few column tiles: K in slices over the blocks of a cluster (8, 4, 4, 2) */
    {OP_GEMM_FP8, F32, {3, 512, 5120}, 0},
    {OP_GEMM_FP8, BF16, {16, 1280, 5120}, 0},
    {OP_GEMM_FP8, F32, {1, 200, 2048}, 0},
    /* gemm_rows' 8-row instances against its 16-row ones through the sub-batches' bits: 32
     * columns a tile, 4 warps a tile's K, N off the tiles; 8 warps with K not a multiple of
     * their chunks; 2 warps, both dequantization routes */
    {OP_GEMM_FP8, F32, {16, 9000, 2304}, 0},
    {OP_GEMM_FP8, BF16, {16, 300, 1344}, 0},
    {OP_GEMM_FP8, F32, {13, 200, 640, 1}, 0},
    {OP_GEMM_FP8_BATCHED, BF16, {5, 7, 100, 640, 1}, 0},
    {OP_GEMM_FP8_BATCHED, F32, {2, 5, 64, 4096}, 0},
    {OP_GEMM_FP8, BF16, {16, 8470, 256, 1}, 0}, /* the same, 4 tiles a block */
    {OP_GEMM_FP8_BATCHED, BF16, {8, 1, 1024, 4096}, 0}, /* the output groups at decode */
    {OP_GEMM_FP8_BATCHED, F32, {8, 16, 1024, 4096}, 0},
    {OP_GEMM_FP8_BATCHED, F32, {3, 5, 20, 64}, 0},  /* scale words 2 bytes off alignment */
    {OP_GEMM_FP8_BATCHED, BF16, {5, 3, 70, 192}, 0},
    {OP_GEMM_FP8_BATCHED, F32, {2, 40, 100, 128}, 0}, /* the tile kernel's batch */
    {OP_GEMM_FP8_BATCHED, F32, {8, 3, 64, 512, 1}, 0}, /* the model's layout: heads in place */
    {OP_GEMM_FP8_BATCHED, BF16, {4, 16, 96, 256, 1}, 0},
    {OP_GEMM_FP8_BATCHED, F32, {3, 70, 40, 64, 1}, 0},
    {OP_GEMM_FP8_BATCHED, F32, {2, 5, 33, 72, 1}, 0}, /* K not whole chunks: CUDA cores */
    {OP_GEMM_FP4, F32, {4, 64, 64, 5, 3}, 0},
    {OP_GEMM_FP4, F32, {8, 100, 96, 12, 5}, 0},
    {OP_GEMM_FP4, BF16, {3, 33, 32, 2, 2}, 0},
    {OP_GEMM_FP4, F32, {16, 256, 512, 300, 50}, 0},
    {OP_GEMM_FP4, BF16, {6, 130, 2560, 200, 40}, 0},
    /* few rows per expert, K whole 128-chunks: the tensor-core kernel for few rows */
    {OP_GEMM_FP4, F32, {8, 77, 256, 24, 12}, 0},
    {OP_GEMM_FP4, BF16, {3, 40, 128, 6, 2}, 0},
    {OP_GEMM_FP4, F32, {40, 232, 256, 60, 20}, 0}, /* 4 tiles a block */
    {OP_GEMM_FP4, BF16, {5, 96, 384, 12, 6, 1}, 0}, /* some tiny scales */
    /* many rows per expert, K whole 128-chunks: the tensor-core tile kernel (gemm_fp4_tiles;
     * partial row tiles, more than one row tile an expert, N not whole tiles) */
    {OP_GEMM_FP4, F32, {3, 200, 384, 300, 100}, 0},
    {OP_GEMM_FP4, BF16, {4, 130, 2304, 400, 200, 1}, 0}, /* some tiny scales */
    {OP_GEMM_FP4, BF16, {2, 256, 128, 130, 130}, 0},
    /* many rows, whole 128-chunks, on Hopper: gemm_fp4_wgrs (tiles of 16..112 rows in steps of
     * 16, experts of over 112 rows in several tiles, columns past N in a warpgroup) */
    {OP_GEMM_FP4, F32, {2, 70, 256, 600, 300}, 0},
    {OP_GEMM_FP4, BF16, {12, 136, 512, 500, 200}, 0},
    {OP_GEMM_FP4, F32, {5, 256, 384, 1000, 500, 1}, 0}, /* some tiny scales */
    {OP_GEMM_FP4, F32, {40, 64, 128, 1200, 400}, 0},
    /* the same with K of 20..32 chunks, so every stage of its 5..8-stage pipelines (by the
     * tile's rows) is refilled several times: ~30 rows an expert (tiles of 16..48), ~80 (64..112),
     * ~200 (a tile of 112 and one of the rest), tiny scales among them */
    {OP_GEMM_FP4, F32, {16, 136, 1280, 480, 240}, 0},
    {OP_GEMM_FP4, BF16, {8, 136, 2048, 640, 320}, 0},
    {OP_GEMM_FP4, F32, {6, 200, 1536, 1200, 400, 1}, 0},
    /* N off the blocks' 128 columns: the fifth block's second warpgroup partly past N */
    {OP_GEMM_FP4, BF16, {4, 600, 512, 400, 200}, 0},
    /* many rows, K not whole 128-chunks: the wmma tile kernel */
    {OP_GEMM_FP4, F32, {6, 70, 160, 150, 60}, 0},
    {OP_GEMM_FP4, F32, {300, 256, 256, 600, 300}, 0}, /* more items than resident blocks */
    {OP_GEMM_FP4, BF16, {8, 160, 384, 80, 40}, 0},    /* rows 8..15 through the ring */
    {OP_GEMM_FP4, F32, {6, 200, 256, 66, 30, 1}, 0},
    /* few rows an expert over 144+ column tiles (gemm_rows' 32-column tiles): K 2304 (2 warps
     * a tile) with experts past 8 rows and N off the tiles; K 5120 (8 warps, 5 chunks each)
     * with tiny scales */
    {OP_GEMM_FP4, F32, {24, 200, 2304, 200, 60}, 0},
    {OP_GEMM_FP4, BF16, {24, 192, 5120, 30, 10, 1}, 0},
    {OP_RMSNORM, F32, {1, 7, 1}, 0},
    {OP_RMSNORM, F32, {3, 512, 1}, 0},
    {OP_RMSNORM, F32, {17, 5120, 0}, 0},
    {OP_RMSNORM, BF16, {5, 1000, 1}, 0},
    {OP_RMSNORM, BF16, {4, 5120, 1}, 0},
    {OP_ROPE, F32, {3, 2, 512, 32, 0}, 0},
    {OP_ROPE, F32, {5, 64, 512, 32, 1}, 0},
    {OP_ROPE, F32, {7, 1, 10, 3, 0}, 0},
    {OP_ROPE, BF16, {2, 3, 128, 32, 1}, 0},
    {OP_FAKE_QUANT, F32, {7, 512, 32, 0, 0}, 0},
    {OP_FAKE_QUANT, F32, {5, 128, 32, 1, 0}, 0},
    {OP_FAKE_QUANT, F32, {9, 512, 16, 2, 0}, 0},
    {OP_FAKE_QUANT, F32, {3, 100, 32, 0, 0}, 0},
    {OP_FAKE_QUANT, F32, {4, 512, 32, 0, 1}, 0},
    {OP_FAKE_QUANT, F32, {4, 128, 32, 1, 1}, 0},
    {OP_FAKE_QUANT, F32, {4, 512, 16, 2, 1}, 0},
    {OP_FAKE_QUANT, F32, {3, 256, 64, 1, 1}, 0}, /* two values a lane */
    {OP_HC_MIX, F32, {1, 4, 5120}, 0},
    {OP_HC_MIX, F32, {3, 4, 100}, 0},
    {OP_HC_MIX, F32, {2, 4, 37}, 0},
    {OP_HC_MIX, F32, {5, 2, 64}, 0},
    /* many tokens: four a block (a partial last block); rows checked against the one-token
     * kernel bit for bit */
    {OP_HC_MIX, F32, {530, 4, 256}, 0},
    {OP_HC_MIX, F32, {600, 2, 64}, 0},
    /* hc * D whole 128-chunks: the tiled kernel at 8, 16 and 32 tokens a block (a part-full
     * last block each); hc * D = 160: the 4-token kernel */
    {OP_HC_MIX, F32, {700, 4, 256}, 0},
    {OP_HC_MIX, F32, {2000, 4, 128}, 0},
    {OP_HC_MIX, F32, {4300, 4, 256}, 0},
    {OP_HC_MIX, F32, {560, 1, 128}, 0},
    {OP_HC_MIX, F32, {540, 4, 40}, 0},
    /* split over blocks up to 66 tokens (67: one block per token, the workspace unused) */
    {OP_HC_MIX_WS, F32, {1, 4, 5120}, 0},
    {OP_HC_MIX_WS, F32, {16, 4, 5120}, 0},
    {OP_HC_MIX_WS, F32, {3, 4, 100}, 0},
    {OP_HC_MIX_WS, F32, {2, 2, 37}, 0},
    {OP_HC_MIX_WS, F32, {5, 1, 300}, 0},
    {OP_HC_MIX_WS, F32, {66, 4, 64}, 0},
    {OP_HC_MIX_WS, F32, {67, 4, 64}, 0},
    /* norm, rope, fake quant in one launch against the three launches */
    {OP_HEAD_FINISH, F32, {3, 1, 512, 1, 32, 32 * 4 + 0}, 0},  /* the latent KV row */
    {OP_HEAD_FINISH, F32, {2, 64, 128, 0, 32, 32 * 4 + 1}, 0}, /* the indexer's queries */
    {OP_HEAD_FINISH, F32, {5, 1, 512, 1, 32, 16 * 4 + 2}, 0},  /* the compressed latent */
    {OP_HEAD_FINISH, F32, {4, 3, 100, 0, 7, 0}, 0},            /* rope alone, odd sizes */
    {OP_HEAD_FINISH, F32, {3, 1, 1500, 1, 0, 64 * 4 + 0}, 0},  /* norm past 1024, no rope */
    {OP_HEAD_FINISH, F32, {2, 1, 96, 1, 16, 64 * 4 + 1}, 0},   /* blocks that do not divide */
    /* rows of 128 without the norm: a warp a row, the last block of 8 rows part-full */
    {OP_HEAD_FINISH, F32, {37, 3, 128, 0, 32, 32 * 4 + 1}, 0},
    {OP_HEAD_FINISH, F32, {5, 4, 128, 0, 0, 32 * 4 + 0}, 0},
    {OP_HC_MIX_COLLAPSE, BF16, {1, 4, 5120}, 0},
    {OP_HC_MIX_COLLAPSE, F32, {16, 4, 5120}, 0},
    {OP_HC_MIX_COLLAPSE, BF16, {3, 2, 300}, 0},  /* fewer threads than the fold's warps */
    {OP_HC_MIX_COLLAPSE, F32, {2, 1, 700}, 0},
    {OP_HC_MIX_COLLAPSE, F32, {70, 4, 64}, 0},   /* no split: the separate launches */
    {OP_HC_COLLAPSE, F32, {3, 4, 5120}, 0},
    {OP_HC_COLLAPSE, BF16, {2, 4, 37}, 0},
    {OP_HC_COLLAPSE, F32, {2, 4, 9000}, 0}, /* past the values a thread keeps */
    {OP_HC_COLLAPSE, BF16, {5, 2, 1000}, 0},
    {OP_HC_COLLAPSE, F32, {2, 1, 129}, 0},
    {OP_HC_EXPAND, F32, {3, 4, 5120}, 0},
    {OP_HC_EXPAND, BF16, {2, 4, 37}, 0},
    {OP_HC_EXPAND, F32, {1, 2, 7}, 0},
    /* (the model's from BT_CUDA_HC_EC_MIN_TOKENS = 65 tokens; the op takes any) */
    {OP_HC_EC, BF16, {65, 4, 5120, 0, 0}, 0},  /* the layer bench's prefill: bf16 in and out */
    {OP_HC_EC, F32, {100, 4, 5120, 1, 0}, 0},  /* the model's: f32 in and out */
    {OP_HC_EC, F32, {70, 2, 300, 0, 1}, 0},    /* fewer values than threads, no norm weight */
    {OP_HC_EC, BF16, {66, 1, 1000, 1, 0}, 0},
    {OP_HC_EC, F32, {67, 4, 37, 1, 0}, 0},
    {OP_HC_EC, F32, {65, 1, 9000, 0, 0}, 0},   /* past the values a thread keeps: two launches */
    {OP_HC_EC, F32, {16, 4, 5120, 1, 0}, 0},   /* a decode batch's size */
    {OP_ATTENTION, F32, {3, 8, 512, 32, 128, 64}, 0},
    {OP_ATTENTION, F32, {2, 5, 96, 8, 7, 0}, 0},
    {OP_ATTENTION, BF16, {4, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION, F32, {1, 3, 64, 16, 1, 33}, 0},
    {OP_INDEX, F32, {3, 32, 128, 1000}, 0},
    {OP_INDEX, F32, {2, 5, 64, 77}, 0},
    {OP_INDEX, F32, {1, 32, 128, 4096}, 0},
    {OP_TOPK, F32, {3, 1000, 512, 0}, 0},
    {OP_TOPK, F32, {2, 77, 512, 0}, 0},
    {OP_TOPK, F32, {4, 5000, 512, 1}, 0},
    {OP_TOPK, F32, {1, 20000, 2048, 0}, 0},
    {OP_TOPK, F32, {2, 8192, 512, 1}, 0}, /* a decode step's shape, with ties */
    {OP_TOPK, F32, {3, 10001, 700, 1}, 0}, /* two tiles of the output pass, the last part-full */
    {OP_MOE_ROUTE, F32, {5, 384, 6}, 0},
    {OP_MOE_ROUTE, F32, {3, 64, 6}, 0},
    {OP_MOE_ROUTE, F32, {1, 17, 3}, 0},
    {OP_MOE_ROUTE, F32, {64, 384, 6}, 0},  /* the last token count with a block a token */
    {OP_MOE_ROUTE, F32, {100, 384, 6}, 0}, /* a warp a token */
    {OP_MOE_ROUTE, F32, {2, 1000, 16}, 0},
    {OP_SWIGLU, F32, {5, 2304, 1}, 0},
    {OP_SWIGLU, BF16, {3, 77, 0}, 0},
    {OP_SWIGLU, BF16, {70, 2304, 1}, 0}, /* 4 columns a thread */
    {OP_SWIGLU, F32, {9, 516, 0}, 0},
    {OP_ENGRAM_GATHER, F32, {3, 24, 256, 1000}, 0},
    {OP_ENGRAM_GATHER, BF16, {2, 5, 64, 37}, 0},
    {OP_ENGRAM_INJECT, F32, {3, 4, 5120}, 0},
    {OP_ENGRAM_INJECT, F32, {2, 4, 100}, 0},
    /* every setting on each shape of row, against the CPU's sampler */
    {OP_SAMPLE, F32, {3, 129280, 0, 0, 0}, 0},
    {OP_SAMPLE, F32, {56, 129280, -1, 0, 3}, 0},
    {OP_SAMPLE, F32, {42, 129280, -1, 1, 0}, 0},
    {OP_SAMPLE, F32, {28, 129280, -1, 2, 0}, 0},
    {OP_SAMPLE, F32, {28, 129280, -1, 3, 0}, 0},
    {OP_SAMPLE, F32, {28, 129280, -1, 4, 0}, 0},
    {OP_SAMPLE, F32, {42, 300, -1, 4, 2}, 0},
    {OP_SAMPLE, F32, {70, 1000, -1, 0, 24}, 0},
    {OP_SAMPLE, F32, {42, 77, -1, 1, 0}, 0},
    {OP_SAMPLE, F32, {28, 6, -1, 1, 0}, 0},
    {OP_SAMPLE, F32, {14, 3, -1, 0, 0}, 0},
    {OP_SAMPLE, F32, {40, 32007, 3, 2, 1}, 0},
    {OP_GEMM_F32, F32, {1, 1014, 64, 0, 0}, 0},
    {OP_GEMM_F32, F32, {7, 33, 40, 40, 17}, 0},
    /* 16 rows: the last the per-column kernel takes; 17: cuBLASLt */
    {OP_GEMM_F32, F32, {16, 77, 300, 5, 3}, 0},
    {OP_GEMM_F32, F32, {17, 77, 300, 0, 2}, 0},
    {OP_GEMM_F32, F32, {120, 2304, 5120, 3, 1}, 0},
    {OP_EMBED, F32, {5, 4, 64, 1014}, 0},
    {OP_EMBED, F32, {3, 1, 5120, 100}, 0},
    {OP_GATHER, F32, {7, 40, 300}, 0},
    {OP_GATHER, F32, {100, 5120, 16}, 0},
    {OP_SCATTER, F32, {7, 40, 300}, 0},
    {OP_SCATTER, F32, {16, 512, 4096}, 0},
    /* ranges aligned to 16, to 4 and to nothing, empty ones, one long; a decode step's count */
    {OP_COPY_RANGES, F32, {37, 3000, 1 << 20}, 0},
    {OP_COPY_RANGES, F32, {1500, 2048, 1 << 24}, 0},
    /* the draws' penalties and logit_bias: one, a decode batch's, and more than a block */
    {OP_LOGIT_ADJUST, F32, {1, 77, 0, 1}, 0},
    {OP_LOGIT_ADJUST, F32, {16, 129280, 3, 900}, 0},
    {OP_LOGIT_ADJUST, F32, {5, 1000, 0, 4000}, 0},
    {OP_LOGIT_MASK, F32, {1, 77, 0, 0}, 0},
    {OP_LOGIT_MASK, F32, {16, 129280, 3, 2}, 0},
    {OP_LOGIT_MASK, F32, {5, 1000, 0, 0}, 0},
    /* the streams' mean into a slot of a wider row (the capture of a target layer), weighted
     * (the draft's collapse before its norm), one stream */
    {OP_HC_MEAN, F32, {3, 4, 5120, 10240, 0}, 0},
    {OP_HC_MEAN, F32, {5, 4, 129, 7, 1}, 0},
    {OP_HC_MEAN, F32, {2, 1, 64, 0, 0}, 0},
    {OP_ADD_ROWS, F32, {16, 129280, 4 * 129280, 0}, 0}, /* 16 sequences' rows of a block of 5 */
    {OP_ADD_ROWS, F32, {3, 1001, 7, 13}, 0},
    {OP_ADD_ROWS, F32, {1, 1, 0, 0}, 0},
    {OP_ACT_QUANT, BF16, {1, 5120, 0, 0, 1, 0}, 0},   /* a decode row into the products' bf16 */
    {OP_ACT_QUANT, BF16, {17, 1280, 96, 0, 1, 0}, 0}, /* rows ldx apart */
    {OP_ACT_QUANT, F32, {5, 2304, 0, 0, 0, 0}, 0},
    {OP_ACT_QUANT, BF16, {9, 2304, 0, 1, 1, 2}, 0},   /* the experts' hidden, in place */
    {OP_ACT_QUANT, F32, {3, 96, 0, 0, 0, 3}, 0},      /* in place, NaN, inf, zeros, ties */
    {OP_ACT_QUANT, BF16, {4, 512, 32, 0, 1, 1}, 0},
    {OP_ACT_QUANT, F32, {2, 64, 0, 1, 0, 0}, 0},
    {OP_SCALE, F32, {1}, 0},
    {OP_SCALE, F32, {100003}, 0},
    {OP_MOE_COMBINE, F32, {5, 64, 6, 1}, 0},
    {OP_MOE_COMBINE, F32, {17, 5120, 6, 0}, 0},
    {OP_MOE_COMBINE, F32, {9, 1030, 6, 1}, 0}, /* D % 4 != 0: one column a thread */
    {OP_MOE_COMBINE, F32, {7, 256, 9, 1}, 0}, /* rows loaded 4 at a time: a third group */
    {OP_COMPRESS, F32, {3, 4, 40}, 0},
    {OP_COMPRESS, F32, {9, 1, 512}, 0},
    {OP_COMPRESS, F32, {5, 16, 512}, 0},
    {OP_BLOCK_MAX, F32, {3, 1000, 64}, 0},
    {OP_BLOCK_MAX, F32, {4, 77, 16}, 0},
    {OP_MASK_BLOCKS, F32, {3, 1000, 64, 5}, 0},
    {OP_MASK_BLOCKS, F32, {2, 77, 8, 0}, 0},
    {OP_TRIM_SEL, F32, {9, 12}, 0},
    /* the routing grouped on the device, against the engine's host counting sort */
    {OP_MOE_GROUP, F32, {1, 6, 384, 0}, 0},
    {OP_MOE_GROUP, F32, {16, 6, 384, 0}, 0},
    {OP_MOE_GROUP, F32, {16, 6, 8, 0}, 0}, /* fewer experts than picks: every slot used */
    {OP_MOE_GROUP, F32, {170, 6, 1024, 0}, 0},
    {OP_MOE_GROUP, F32, {5, 3, 7, 1}, 0},
    /* the decode's router logits: real widths, f32 (the engine's) and bf16; 16 x 1024 experts;
     * a part-full column group; D off the quarters */
    {OP_ROUTER, F32, {1, 384, 5120}, 0},
    {OP_ROUTER, F32, {16, 384, 5120}, 0},
    {OP_ROUTER, BF16, {1, 384, 5120}, 0},
    {OP_ROUTER, BF16, {16, 384, 5120}, 0},
    {OP_ROUTER, F32, {16, 1024, 2048}, 0},
    {OP_ROUTER, BF16, {16, 1024, 5120}, 0}, /* 56 KB of shared memory: past the default 48 */
    {OP_ROUTER, BF16, {3, 33, 96}, 0},
    {OP_ROUTER, F32, {7, 100, 204}, 0},
    {OP_ROUTER, F32, {1, 384, 5120}, 1},
    {OP_ROUTER, F32, {16, 384, 5120}, 1},
    {OP_TO_BF16, BF16, {7, 40, 3}, 0},
    {OP_TO_BF16, BF16, {64, 5120, 0}, 0},
    {OP_ATTENTION_WS, F32, {1, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_WS, BF16, {1, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_WS, F32, {1, 4, 40, 16, 8, 6}, 0},
    {OP_ATTENTION_WS, F32, {3, 8, 512, 32, 128, 64}, 0},
    {OP_ATTENTION_WS, F32, {2, 5, 96, 8, 7, 0}, 0},
    {OP_ATTENTION_WS, BF16, {16, 64, 512, 32, 128, 512}, 0},
    {OP_GEMM_FP4_LIST, F32, {384, 256, 512, 6, 1}, 0},
    {OP_GEMM_FP4_LIST, BF16, {16, 130, 2560, 200, 40}, 0},
    {OP_GEMM_FP4_LIST, F32, {40, 77, 256, 24, 12, 2}, 0}, /* padded list, few rows */
    {OP_GEMM_FP4_LIST, F32, {12, 96, 320, 200, 30, 2}, 0}, /* padded list, tile kernel */
    {OP_GEMM_FP4_LIST, BF16, {48, 160, 1024, 60, 20, 2}, 0}, /* padded, 32-column tiles */
    {OP_GEMM_FP4_LIST, F32, {12, 96, 256, 400, 100, 2}, 0}, /* padded list, MMA tiles */
    /* the experts' w13 with their SwiGLU: a token's 6 experts at the real widths, 16 tokens',
     * the demo model's K of one chunk (7 of 8 warps without one), 3 chunks, more than 8 rows
     * an expert (two passes), no limit, f32 out */
    {OP_FP4_SWIGLU, BF16, {8, 4608, 5120, 6, 1, 7}, 0},
    {OP_FP4_SWIGLU, BF16, {40, 512, 1024, 96, 16, 7}, 0},
    {OP_FP4_SWIGLU, BF16, {8, 128, 128, 12, 4, 7}, 0},
    {OP_FP4_SWIGLU, F32, {3, 192, 384, 30, 20, 0}, 0},
    {OP_FP4_SWIGLU, BF16, {2, 64, 1024, 26, 16, 7}, 0},
    /* a prefill's (gemm_fp4_wgrs' SW form): the real widths with experts of over 112 rows (two
     * row tiles), units past I in the last block (I 96, 200: not whole blocks of 64), f32 */
    {OP_FP4_SWIGLU, BF16, {6, 4608, 5120, 700, 300, 7, 150}, 0},
    {OP_FP4_SWIGLU, BF16, {5, 192, 1280, 400, 100, 7, 120}, 0},
    {OP_FP4_SWIGLU, F32, {4, 400, 384, 300, 90, 0, 100}, 0},
    {OP_FP4_SWIGLU, BF16, {40, 256, 256, 900, 200, 7, 30}, 0},
    /* the MoE's combine in the expand: a decode step's, 16 tokens', odd widths, no shared */
    {OP_EXPAND_MOE, F32, {1, 4, 5120, 6, 1}, 0},
    {OP_EXPAND_MOE, F32, {16, 4, 5120, 6, 1}, 0},
    {OP_EXPAND_MOE, F32, {3, 2, 100, 5, 0}, 0},
    {OP_EXPAND_MOE, F32, {5, 1, 77, 3, 1}, 0},
    /* the index queries' product with their RoPE and rounding: a decode step's at the real
     * widths (32 heads of 128, the last 64 channels rotated, FP4), 8 rows, the whole head
     * rotated, the demo model's heads of 32 (K one chunk), no RoPE, FP8 and FP4-e4m3 rounding,
     * 3 chunks */
    {OP_FP8_QFINISH, F32, {1, 4096, 1280, 128, 32, 1}, 0},
    {OP_FP8_QFINISH, F32, {8, 4096, 1280, 128, 32, 1}, 0},
    {OP_FP8_QFINISH, F32, {6, 512, 1280, 128, 64, 1}, 0},
    {OP_FP8_QFINISH, F32, {3, 128, 64, 32, 8, 1}, 0},
    {OP_FP8_QFINISH, F32, {5, 256, 192, 64, 0, 0}, 0},
    {OP_FP8_QFINISH, F32, {7, 384, 320, 96, 16, 2}, 0},
    {OP_INDEX_SETS, F32, {5, 32, 128, 1000}, 0},
    {OP_INDEX_SETS, F32, {3, 8, 40, 77}, 0},
    /* tensor-core attention: the model's shape (64 heads, 128 window + 512 selected keys), the
     * key limit (1024), head counts off the 32-head tile, small dims, no rotation, no lists */
    {OP_ATTENTION_TC, BF16, {3, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_TC, F32, {2, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_TC, BF16, {2, 64, 512, 32, 512, 512}, 0},
    {OP_ATTENTION_TC, F32, {5, 8, 512, 32, 128, 64}, 0},
    {OP_ATTENTION_TC, BF16, {4, 20, 96, 0, 7, 0}, 0},
    {OP_ATTENTION_TC, F32, {3, 33, 64, 16, 1, 33}, 0},
    {OP_ATTENTION_TC, BF16, {5, 33, 16, 8, 3, 5}, 0},
    {OP_ATTENTION_TC, F32, {4, 20, 64, 32, 40, -1}, 0},
    {OP_ATTENTION_TC, BF16, {2, 64, 512, 32, 128, -1}, 0},
    {OP_ATTENTION_TC, F32, {1, 1, 16, 0, 1, -1}, 0},
    /* head dims padded to whole 16-wide MMA steps: the golden fixtures' 40, and 24 */
    {OP_ATTENTION_TC, F32, {4, 8, 40, 10, 12, 6}, 0},
    {OP_ATTENTION_TC, BF16, {3, 8, 24, 4, 5, 3}, 0},
    /* bf16 prefill-sized launches go through the flash kernel (64 heads a block, keys 32 a
     * chunk): a second, nearly empty head block, dims padded to a multiple of 64, a last chunk
     * part full */
    {OP_ATTENTION_TC, BF16, {3, 65, 72, 8, 40, 100}, 0},
    {OP_ATTENTION_TC, BF16, {2, 128, 512, 32, 33, 31}, 0},
    {OP_ATTENTION_FLASH, F32, {3, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_FLASH, F32, {4, 20, 40, 10, 12, 6}, 0}, /* the golden fixtures' dim */
    {OP_ATTENTION_FLASH, BF16, {3, 33, 64, 16, 40, -1}, 0},
    {OP_ATTENTION_FLASH, F32, {3, 16, 512, 32, 128, 512}, 0}, /* a TP4 rank: 3 groups idle */
    /* dim 512 and whole 64-head blocks take Hopper's warpgroup kernel: two head blocks with a
     * part-full last chunk, a lone part-full chunk without selected keys, no rotation */
    {OP_ATTENTION_FLASH, BF16, {3, 128, 512, 32, 100, 37}, 0},
    {OP_ATTENTION_FLASH, F32, {2, 64, 512, 32, 7, -1}, 0},
    {OP_ATTENTION_FLASH, F32, {3, 64, 512, 0, 128, 512}, 0},
    {OP_ATTENTION_FLASH, F32, {5, 64, 512, 32, 128, 512}, 0}, /* token 3 without keys */
    /* decode: a token's keys split over blocks, partials folded with the sink (single keys,
     * selected-only and empty splits come from the token patterns above) */
    {OP_ATTENTION_TC_WS, BF16, {1, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_TC_WS, F32, {4, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_TC_WS, BF16, {16, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_TC_WS, F32, {3, 20, 96, 8, 40, 200}, 0},
    {OP_ATTENTION_TC_WS, BF16, {2, 33, 64, 16, 100, -1}, 0},
    {OP_ATTENTION_TC_BATCH, F32, {16, 64, 512, 32, 128, 512}, 0}, /* the model's decode step */
    {OP_ATTENTION_TC_BATCH, BF16, {5, 20, 96, 8, 40, 200}, 0},
    {OP_ATTENTION_TC_BATCH, F32, {3, 33, 64, 16, 100, -1}, 0},
    {OP_ATTENTION_BATCH, F32, {16, 64, 512, 32, 128, 512}, 0},
    {OP_ATTENTION_BATCH, BF16, {4, 5, 96, 8, 70, 100}, 0},
    /* tensor-core indexer: the model's shape (32 heads x 128, 8192 keys, causal-like visible),
     * token counts off the tile, key counts off 128, small heads and dims, unrounded inputs */
    {OP_INDEX_TC, F32, {64, 32, 128, 8192, 0}, 0},
    {OP_INDEX_TC, F32, {1, 32, 128, 4096, 0}, 0},
    {OP_INDEX_TC, F32, {5, 32, 128, 1000, 0}, 0},
    {OP_INDEX_TC, F32, {3, 7, 64, 1000, 0}, 0},
    {OP_INDEX_TC, F32, {1, 1, 16, 37, 0}, 0},
    {OP_INDEX_TC, F32, {3, 32, 16, 37, 0}, 0},
    {OP_INDEX_TC, F32, {5, 32, 128, 1000, 1}, 0},
    /* partial key tiles, tokens not a multiple of 4; rows of 4-float loads and (dim 30) of
     * single floats; then enough blocks for four key tiles a block (a partial last group) */
    {OP_INDEX_TC, F32, {9, 32, 128, 2000, 0}, 0},
    {OP_INDEX_TC, F32, {6, 5, 30, 700, 0}, 0},
    {OP_INDEX_TC, F32, {1060, 4, 16, 700, 0}, 0}, /* enough blocks for 4 key tiles a block */
    {OP_INDEX_TC, F32, {600, 8, 40, 1300, 0}, 0},
    /* head dims that are not whole 16-wide MMA steps are padded with zeros (the golden
     * fixtures' 40; 24 un-rounded, at the bf16 bound) */
    {OP_INDEX_TC, F32, {6, 8, 40, 300, 0}, 0},
    {OP_INDEX_TC, F32, {3, 8, 24, 100, 1}, 0},
    /* Hopper's warpgroup kernel, 16 tokens a block: a partial last group (unrounded inputs),
     * a head dim of exactly one 64-wide half with keys off its 64-key steps */
    {OP_INDEX_TC, F32, {37, 32, 128, 1000, 1}, 0},
    {OP_INDEX_TC, F32, {20, 32, 64, 130, 0}, 0},
    {OP_INDEX_SETS_TC, F32, {64, 32, 128, 8192, 0}, 0},
    {OP_INDEX_SETS_TC, F32, {5, 32, 128, 1000, 0}, 0},
    {OP_INDEX_SETS_TC, F32, {3, 7, 64, 77, 0}, 0},
    {OP_INDEX_SETS_TC, F32, {1, 1, 16, 37, 0}, 0},
    {OP_INDEX_SETS_TC, F32, {4, 32, 128, 1000, 1}, 0},
    {OP_INDEX_SETS_TC, F32, {5, 8, 40, 300, 0}, 0},
    {OP_DEQUANT_FP8, BF16, {1, 1}, 0},
    {OP_DEQUANT_FP8, BF16, {33, 70}, 0},
    {OP_DEQUANT_FP8, BF16, {31, 32}, 0},
    {OP_DEQUANT_FP8, BF16, {4096, 512}, 0},
    {OP_DEQUANT_FP8, BF16, {2304, 5120}, 0},
    {OP_FP4_FRAG, BF16, {1}, 0},
    {OP_FP4_FRAG, BF16, {100003}, 0}, /* (391 blocks, the last part-full) */
    /* few FP4 rows an expert, many column tiles: gemm_rows with 32-column tiles, several a
     * block, the last block's tiles fewer and its last tile part past N; then experts of 9..16
     * rows (a second pass for rows 8..15) in the same */
    {OP_GEMM_FP4_LIST, BF16, {384, 2000, 384, 96, 16}, 0},
    {OP_GEMM_FP4, F32, {12, 11200, 256, 96, 40}, 0},
    /* the same with K of 8 chunks (a tile's K over all 8 warps, as the model's w13), the
     * experts' 2 tiles a block: 16-column tiles with N off them, then 32-column ones */
    {OP_GEMM_FP4_LIST, BF16, {64, 200, 1024, 12, 2}, 0},
    {OP_GEMM_FP4_LIST, F32, {128, 2000, 1024, 96, 16}, 0},
    /* few FP8 rows on gemm_rows' 16-column tiles (K not sliced), scales on both conversion
     * routes: 8 rows, then 9..16 in one pass with K of 3 chunks (5 warps without any) */
    {OP_GEMM_FP8, F32, {5, 1000, 128, 1}, 0},
    {OP_GEMM_FP8, BF16, {12, 1000, 192, 1}, 0},
    /* large: timed with --perf (GEMM references on a few sampled rows) */
    {OP_GEMM_BF16, BF16, {4096, 4096, 4096}, 1},
    {OP_GEMM_BF16, BF16, {8, 32768, 1280}, 1},
    {OP_GEMM_FP8, BF16, {1, 32768, 1280}, 1},
    {OP_GEMM_FP8, BF16, {8, 5120, 8192}, 1},
    {OP_GEMM_FP8, BF16, {1, 5120, 8192}, 1},
    {OP_GEMM_FP8, F32, {1, 4608, 5120}, 1},
    {OP_GEMM_FP8, BF16, {16, 32768, 1280}, 1},
    {OP_GEMM_FP8, BF16, {16, 1280, 5120}, 1},
    {OP_GEMM_FP8_BATCHED, BF16, {8, 1, 1024, 4096}, 1},
    {OP_GEMM_FP8_BATCHED, BF16, {8, 16, 1024, 4096}, 1},
    {OP_GEMM_FP8, BF16, {4096, 5120, 8192}, 1},
    {OP_GEMM_FP4, BF16, {64, 2304, 5120, 48, 8}, 1},
    {OP_GEMM_FP4, BF16, {384, 2304, 5120, 6, 1}, 1},
    {OP_GEMM_FP4_LIST, BF16, {384, 2304, 5120, 6, 1}, 1},
    {OP_GEMM_FP4_LIST, BF16, {384, 2304, 5120, 96, 16}, 1},
    /* the prefill's: 64 rows an expert on average (4096 tokens x top-6 over 384 experts) */
    {OP_GEMM_FP4, F32, {64, 4608, 5120, 4096, 1365}, 1},
    {OP_GEMM_FP4, F32, {64, 5120, 2304, 4096, 1365}, 1},
    {OP_GEMM_FP4, BF16, {64, 2304, 5120, 8192, 1365}, 1},
    {OP_GEMM_FP4, BF16, {64, 5120, 2304, 8192, 1365}, 1},
    {OP_RMSNORM, BF16, {4096, 5120, 1}, 1},
    {OP_HC_MIX, F32, {1024, 4, 5120}, 1},
    {OP_HC_MIX, F32, {4096, 4, 5120}, 1},
    {OP_HC_MIX, F32, {1, 4, 5120}, 1},
    {OP_HC_MIX_WS, F32, {1, 4, 5120}, 1},
    {OP_HC_MIX_WS, F32, {16, 4, 5120}, 1},
    {OP_HC_EXPAND, BF16, {4096, 4, 5120}, 1},
    {OP_ATTENTION, BF16, {64, 64, 512, 32, 128, 512}, 1},
    {OP_ATTENTION, BF16, {1, 64, 512, 32, 128, 512}, 1},
    {OP_ATTENTION_WS, BF16, {1, 64, 512, 32, 128, 512}, 1},
    {OP_ATTENTION_TC, BF16, {1, 64, 512, 32, 128, 512}, 1},
    {OP_ATTENTION_TC_WS, BF16, {1, 64, 512, 32, 128, 512}, 1},
    {OP_ATTENTION_TC_WS, BF16, {16, 64, 512, 32, 128, 512}, 1},
    {OP_ATTENTION_WS, BF16, {16, 64, 512, 32, 128, 512}, 1},
    {OP_INDEX, F32, {16, 32, 128, 32768}, 1},
    {OP_INDEX, F32, {1, 32, 128, 8192}, 1},
    {OP_INDEX_SETS, F32, {16, 32, 128, 8192}, 1},
    {OP_ATTENTION_TC, BF16, {4096, 64, 512, 32, 128, 512}, 1},
    {OP_ATTENTION_TC, BF16, {4096, 16, 512, 32, 128, 512}, 1}, /* a TP4 rank's heads */
    {OP_INDEX_TC, F32, {4096, 32, 128, 8192, 0}, 1},
    {OP_DEQUANT_FP8, BF16, {32768, 1280}, 1},
    {OP_TOPK, F32, {64, 65536, 512, 0}, 1},
    {OP_TOPK, F32, {1, 8192, 512, 0}, 1}, /* decode: one block a token */
    {OP_TOPK, F32, {16, 8192, 512, 0}, 1},
    {OP_MOE_ROUTE, F32, {4096, 384, 6}, 1},
    {OP_MOE_ROUTE, F32, {1, 384, 6}, 1},
    {OP_SAMPLE, F32, {64, 129280, 0, 0, 0}, 1},
    /* a decode batch at the API's defaults; with top_p; with logprobs and the top 20 */
    {OP_SAMPLE, F32, {16, 129280, 2, 0, 0}, 1},
    {OP_SAMPLE, F32, {16, 129280, 3, 0, 0}, 1},
    {OP_SAMPLE, F32, {16, 129280, 1, 0, 0}, 1},
    {OP_SAMPLE, F32, {16, 129280, 6, 0, 0}, 1},
    {OP_SAMPLE, F32, {1, 129280, 6, 0, 0}, 1},
    {OP_SAMPLE, F32, {16, 129280, 3, 2, 0}, 1},
};

/* ---- plumbing --------------------------------------------------------------------------- */

enum { PERF_WARMUP = 3, PERF_REPS = 21, MAX_ALLOCS = 32 };

static int g_perf;
static uint64_t g_rng;
static void *g_allocs[MAX_ALLOCS];
static int g_nallocs;
static bt_cuda_blas_t *g_blas;
static int g_sm_major; /* the device's compute capability, major */
static cudaEvent_t g_e0, g_e1;

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* a launcher's status and the launch's asynchronous errors */
#define BT_OK_OR_DIE(call)                                                                         \
    do {                                                                                           \
        bt_status_t s_ = (call);                                                                   \
        if (s_ != BT_OK) {                                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, bt_status_str(s_));     \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static float frand(void) /* uniform in [-1, 1) */
{
    return (float)((double)(rnd() >> 11) * 0x1p-52 - 1.0);
}

static int irand(int n) { return (int)(rnd() % (uint64_t)n); }


static void *dalloc(size_t bytes)
{
    void *p;
    if (g_nallocs == MAX_ALLOCS) {
        fprintf(stderr, "too many allocations\n");
        exit(2);
    }
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    g_allocs[g_nallocs++] = p;
    return p;
}

static void dfree_all(void)
{
    for (int i = 0; i < g_nallocs; i++) cudaFree(g_allocs[i]);
    g_nallocs = 0;
}

static void *dup(const void *h, size_t bytes)
{
    void *d = dalloc(bytes);
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void get(void *h, const void *d, size_t bytes)
{
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static void poison(void *d, size_t bytes) { CUDA_OK(cudaMemset(d, 0xff, bytes)); }
static void poison_int(void *d, size_t bytes) { CUDA_OK(cudaMemset(d, 0x7f, bytes)); }

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    return p;
}

/* bf16 device copy of f32 host data (the host data rounded in place, so the reference sees
 * exactly what the GPU gets) */
static uint16_t *dup_bf16(float *h, size_t n)
{
    uint16_t *b = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        b[i] = bt_f32_to_bf16(h[i]);
        h[i] = bt_bf16_to_f32(b[i]);
    }
    uint16_t *d = dup(b, n * 2);
    free(b);
    return d;
}

/* activation buffer of dtype dt from f32 host data (rounded in place for bf16) */
static void *dup_act(float *h, size_t n, bt_cuda_dtype_t dt)
{
    return dt == BF16 ? (void *)dup_bf16(h, n) : dup(h, n * 4);
}

/* device activation of dtype dt -> f32 host */
static float *get_act(const void *d, size_t n, bt_cuda_dtype_t dt)
{
    float *h = xmalloc(n * 4);
    if (dt == BF16) {
        uint16_t *b = xmalloc(n * 2);
        get(b, d, n * 2);
        for (size_t i = 0; i < n; i++) h[i] = bt_bf16_to_f32(b[i]);
        free(b);
    } else {
        get(h, d, n * 4);
    }
    return h;
}

static float *frandv(size_t n, float scale)
{
    float *v = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
    return v;
}

/* n floats of host h onto the device; h freed */
static float *dup_free(float *h, size_t n)
{
    float *d = dup(h, n * 4);
    free(h);
    return d;
}

typedef struct {
    double err, bound;
    int finite, exact_ok; /* exact_ok: integer outputs / bit patterns matched */
    float ms;
    double bytes, flops; /* for the floor */
    char note[96];
} result_t;

/* ||out - ref|| / ||ref|| over n values; non-finite output marks the result */
static void relerr(result_t *r, const float *out, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i])) {
            r->finite = 0;
            continue;
        }
        double d = (double)out[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    double e = den > 0 ? sqrt(num / den) : sqrt(num);
    if (e > r->err) r->err = e;
}

static double bound_for(bt_cuda_dtype_t dt) { return dt == BF16 ? 1e-2 : 1e-5; }

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* times `launch(ctx)`: warm-up, then PERF_REPS runs between events, median */
typedef void (*launch_fn)(void *ctx);
static float time_it(launch_fn launch, void *ctx)
{
    float t[PERF_REPS];
    for (int i = 0; i < PERF_WARMUP; i++) launch(ctx);
    CUDA_OK(cudaDeviceSynchronize());
    for (int i = 0; i < PERF_REPS; i++) {
        CUDA_OK(cudaEventRecord(g_e0, 0));
        launch(ctx);
        CUDA_OK(cudaEventRecord(g_e1, 0));
        CUDA_OK(cudaEventSynchronize(g_e1));
        CUDA_OK(cudaEventElapsedTime(&t[i], g_e0, g_e1));
    }
    CUDA_OK(cudaGetLastError());
    qsort(t, PERF_REPS, sizeof(float), cmp_float);
    return t[PERF_REPS / 2];
}

/* the rows a GEMM reference checks: all, or a few spread ones when the problem is large */
static int check_rows(int M, double macs, int *rows)
{
    if (macs < 3e9) {
        for (int i = 0; i < M; i++) rows[i] = i;
        return M;
    }
    int n = 0;
    rows[n++] = 0;
    rows[n++] = M / 2;
    rows[n++] = M - 1;
    return n;
}

/* ---- GEMMs ------------------------------------------------------------------------------ */

typedef struct {
    void *y;
    bt_cuda_dtype_t yd;
    const uint16_t *x, *w;
    const uint8_t *w8, *s8;
    const int32_t *rows, *offs;
    int M, N, K, E, max_rows;
    int32_t *elist; /* OP_GEMM_FP4_LIST: the experts with rows */
    int n_listed;
    int ldx, ldy; /* OP_GEMM_FP8_BATCHED: row and batch strides (elements) */
    long long x_stride, y_stride;
} gemm_ctx_t;

static void launch_gemm_bf16(void *p)
{
    gemm_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_gemm_bf16(g_blas, c->y, c->yd, c->x, c->w, c->M, c->N, c->K, 0));
}

static void launch_gemm_fp8(void *p)
{
    gemm_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_gemm_fp8(c->y, c->yd, c->x, c->w8, c->s8, c->M, c->N, c->K, 0));
}

static void launch_gemm_fp4(void *p)
{
    gemm_ctx_t *c = p;
    if (c->elist)
        BT_OK_OR_DIE(bt_cuda_gemm_fp4_grouped_list(c->y, c->yd, c->x, c->rows, c->offs, c->elist, c->n_listed,
                                                   c->max_rows, c->w8, c->s8, c->N, c->K, 0));
    else
        BT_OK_OR_DIE(bt_cuda_gemm_fp4_grouped(c->y, c->yd, c->x, c->rows, c->offs, c->E, c->max_rows,
                                              c->w8, c->s8, c->N, c->K, 0));
}

/* random e4m3 byte, never NaN */
static uint8_t rand_e4m3(void)
{
    uint8_t b;
    do b = (uint8_t)rnd();
    while ((b & 0x7f) == 0x7f);
    return b;
}

/* the dense GEMMs: weights as f32 for the reference (exact for fp8 and bf16) */
static void run_gemm(const case_t *cs, result_t *r)
{
    int M = cs->s[0], N = cs->s[1], K = cs->s[2], fp8 = cs->op == OP_GEMM_FP8;
    float *x = frandv((size_t)M * K, 1.0f), *w = xmalloc((size_t)N * K * 4);
    gemm_ctx_t c = {0};
    c.M = M;
    c.N = N;
    c.K = K;
    c.yd = cs->dt;
    c.x = dup_bf16(x, (size_t)M * K);
    if (fp8) {
        int ks = (K + 31) / 32, ns = (N + 31) / 32;
        uint8_t *w8 = xmalloc((size_t)N * K), *s8 = xmalloc((size_t)ns * ks);
        /* s[3] 1: scale bytes 138..149, some past the few-row kernel's bf16 route (<= 142):
         * both routes in one launch, chunk by chunk */
        for (size_t i = 0; i < (size_t)ns * ks; i++)
            s8[i] = (uint8_t)(cs->s[3] ? 138 + irand(12) : 120 + irand(8));
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                w8[(size_t)n * K + k] = rand_e4m3();
                w[(size_t)n * K + k] = bt_e4m3_to_f32(w8[(size_t)n * K + k]) *
                                       bt_e8m0_to_f32(s8[(size_t)(n / 32) * ks + k / 32]);
            }
        c.w8 = dup(w8, (size_t)N * K);
        c.s8 = dup(s8, (size_t)ns * ks);
        free(w8);
        free(s8);
        r->bytes = (double)N * K + (double)ns * ks;
    } else {
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = frand();
        c.w = dup_bf16(w, (size_t)N * K);
        r->bytes = 2.0 * N * K;
    }
    size_t ysz = (size_t)M * N * (cs->dt == BF16 ? 2 : 4);
    r->bytes += 2.0 * M * K + (double)ysz;
    r->flops = 2.0 * M * N * K;
    c.y = dalloc(ysz);
    poison(c.y, ysz);
    launch_fn fn = fp8 ? launch_gemm_fp8 : launch_gemm_bf16;
    fn(&c);
    float *y = get_act(c.y, (size_t)M * N, cs->dt);
    int *rows = xmalloc((size_t)M * sizeof(int));
    int nr = check_rows(M, (double)M * N * K, rows);
    float *yo = xmalloc((size_t)nr * N * 4), *ref = xmalloc((size_t)nr * N * 4);
    for (int i = 0; i < nr; i++)
        for (int n = 0; n < N; n++) {
            double acc = 0.0;
            const float *xr = x + (size_t)rows[i] * K, *wr = w + (size_t)n * K;
            for (int k = 0; k < K; k++) acc += (double)xr[k] * wr[k];
            ref[(size_t)i * N + n] = (float)acc;
            yo[(size_t)i * N + n] = y[(size_t)rows[i] * N + n];
        }
    relerr(r, yo, ref, (size_t)nr * N);
    for (size_t i = 0; i < (size_t)M * N; i++)
        if (!isfinite(y[i])) r->finite = 0;
    if (nr < M) snprintf(r->note, sizeof(r->note), "%d rows checked", nr);
    /* a decode step's rows (<= 16) give the same bits alone as together: the first row and the
     * first half again on their own, compared bit for bit (the engine's batch invariance) */
    if (M > 1 && M <= 16 && !cs->perf) {
        int sub[2] = {1, (M + 1) / 2}, differ = 0;
        for (int i = 0; i < 2; i++) {
            gemm_ctx_t c2 = c;
            size_t bytes = (size_t)sub[i] * N * (cs->dt == BF16 ? 2 : 4);
            c2.M = sub[i];
            c2.y = dalloc(bytes);
            poison(c2.y, bytes);
            fn(&c2);
            float *y2 = get_act(c2.y, (size_t)sub[i] * N, cs->dt);
            if (memcmp(y2, y, (size_t)sub[i] * N * sizeof(float)) != 0) differ++;
            free(y2);
        }
        if (differ) r->exact_ok = 0;
        snprintf(r->note + strlen(r->note), sizeof(r->note) - strlen(r->note), "%srows 1, %d alone: %s",
                 nr < M ? "; " : "", sub[1], differ ? "OTHER BITS" : "same bits");
    }
    if (g_perf && cs->perf) r->ms = time_it(fn, &c);
    free(x), free(w), free(y), free(rows), free(yo), free(ref);
}

static void launch_gemm_fp8_batched(void *p)
{
    gemm_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_gemm_fp8_batched(c->y, c->yd, c->ldy, c->y_stride, c->x, c->ldx,
                                          c->x_stride, c->w8, c->s8, c->E, c->M, c->N, c->K, 0));
}

/* s = batch M N K token-major: `batch` independent FP8 products, each with its own weights and
 * scales; token-major as the model's grouped output projection lays them out (row m of product
 * b at m * ldx + b * K), rows padded by 8 elements, the output's padding checked untouched */
static void run_gemm_fp8_batched(const case_t *cs, result_t *r)
{
    int B = cs->s[0], M = cs->s[1], N = cs->s[2], K = cs->s[3], tm = cs->s[4];
    int ks = (K + 31) / 32, ns = (N + 31) / 32;
    size_t nw = (size_t)B * N * K, nsc = (size_t)B * ns * ks;
    gemm_ctx_t c = {0};
    c.E = B;
    c.M = M;
    c.N = N;
    c.K = K;
    c.yd = cs->dt;
    c.ldx = tm ? B * K + 8 : K;
    c.x_stride = tm ? K : (long long)M * K;
    c.ldy = tm ? B * N + 8 : N;
    c.y_stride = tm ? N : (long long)M * N;
    size_t nx = (size_t)(tm ? M : B * M) * c.ldx, ny = (size_t)(tm ? M : B * M) * c.ldy;
    float *x = frandv(nx, 1.0f), *w = xmalloc(nw * 4);
    uint8_t *w8 = xmalloc(nw), *s8 = xmalloc(nsc);
    for (size_t i = 0; i < nsc; i++) s8[i] = (uint8_t)(120 + irand(8));
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) {
                size_t i = ((size_t)b * N + n) * K + k;
                w8[i] = rand_e4m3();
                w[i] = bt_e4m3_to_f32(w8[i]) *
                       bt_e8m0_to_f32(s8[(size_t)b * ns * ks + (size_t)(n / 32) * ks + k / 32]);
            }
    c.x = dup_bf16(x, nx); /* (x is rounded to bf16 in place: the reference reads the same) */
    c.w8 = dup(w8, nw);
    c.s8 = dup(s8, nsc);
    size_t ysz = ny * (cs->dt == BF16 ? 2 : 4);
    c.y = dalloc(ysz);
    poison(c.y, ysz);
    launch_gemm_fp8_batched(&c);
    float *y = get_act(c.y, ny, cs->dt), *yo = xmalloc((size_t)B * M * N * 4),
          *ref = xmalloc((size_t)B * M * N * 4);
    size_t untouched = 0, pad = 0;
    for (int b = 0; b < B; b++)
        for (int m = 0; m < M; m++) {
            const float *xr = x + b * c.x_stride + (size_t)m * c.ldx;
            for (int n = 0; n < N; n++) {
                double acc = 0.0;
                const float *wr = w + ((size_t)b * N + n) * K;
                for (int k = 0; k < K; k++) acc += (double)xr[k] * wr[k];
                size_t o = ((size_t)b * M + m) * N + n;
                ref[o] = (float)acc;
                yo[o] = y[b * c.y_stride + (size_t)m * c.ldy + n];
            }
        }
    if (tm) /* the 8 padding elements of every output row stay poisoned (NaN) */
        for (int m = 0; m < M; m++)
            for (int j = 0; j < 8; j++, pad++) untouched += isnan(y[(size_t)m * c.ldy + B * N + j]);
    relerr(r, yo, ref, (size_t)B * M * N);
    for (size_t i = 0; i < (size_t)B * M * N; i++)
        if (!isfinite(yo[i])) r->finite = 0;
    if (untouched != pad) r->exact_ok = 0;
    if (tm) snprintf(r->note, sizeof(r->note), "padding untouched: %zu of %zu", untouched, pad);
    r->bytes = (double)nw + (double)nsc + 2.0 * B * M * K + (double)B * M * N * (cs->dt == BF16 ? 2 : 4);
    r->flops = 2.0 * B * M * N * K;
    if (g_perf && cs->perf) r->ms = time_it(launch_gemm_fp8_batched, &c);
    free(x), free(w), free(w8), free(s8), free(y), free(yo), free(ref);
}

static void launch_dequant_fp8(void *p)
{
    gemm_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_dequant_fp8(c->y, c->w8, c->s8, c->N, c->K, 0));
}

/* s = N K: weights and scales made as run_gemm makes them (scales over a wider range); the
 * dequantized values are exact in bf16, so every output's bits must match */
static void run_dequant_fp8(const case_t *cs, result_t *r)
{
    int N = cs->s[0], K = cs->s[1], ks = (K + 31) / 32, ns = (N + 31) / 32;
    size_t nw = (size_t)N * K;
    uint8_t *w8 = xmalloc(nw), *s8 = xmalloc((size_t)ns * ks);
    for (size_t i = 0; i < (size_t)ns * ks; i++) s8[i] = (uint8_t)(112 + irand(24));
    for (size_t i = 0; i < nw; i++) w8[i] = rand_e4m3();
    gemm_ctx_t c = {0};
    c.N = N;
    c.K = K;
    c.w8 = dup(w8, nw);
    c.s8 = dup(s8, (size_t)ns * ks);
    c.y = dalloc(nw * 2);
    poison(c.y, nw * 2);
    launch_dequant_fp8(&c);
    uint16_t *y = xmalloc(nw * 2);
    get(y, c.y, nw * 2);
    size_t diff = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            size_t i = (size_t)n * K + k;
            float v = bt_e4m3_to_f32(w8[i]) * bt_e8m0_to_f32(s8[(size_t)(n / 32) * ks + k / 32]);
            uint16_t want = bt_f32_to_bf16(v);
            if (!isfinite(bt_bf16_to_f32(y[i]))) r->finite = 0;
            diff += y[i] != want;
        }
    r->bound = 0.0;
    r->err = (double)diff;
    r->exact_ok = diff == 0;
    snprintf(r->note, sizeof(r->note), "bit-exact: %zu of %zu differ", diff, nw);
    r->bytes = 3.0 * nw + (double)ns * ks;
    if (g_perf && cs->perf) r->ms = time_it(launch_dequant_fp8, &c);
    free(w8), free(s8), free(y);
}

/* FP4 codes into fragment order on the device: the same bytes as the host's form */
static void run_fp4_frag(const case_t *cs, result_t *r)
{
    const size_t runs = (size_t)cs->s[0], bytes = 16 * runs;
    uint8_t *w = xmalloc(bytes), *want = xmalloc(bytes), *got = xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    for (size_t i = 0; i < runs; i++) bt_fp4_run_to_frag(w + 16 * i, want + 16 * i);
    uint8_t *d = dup(w, bytes);
    BT_OK_OR_DIE(bt_cuda_fp4_to_frag(d, bytes, 0));
    get(got, d, bytes);
    size_t diff = 0;
    for (size_t i = 0; i < bytes; i++) diff += got[i] != want[i];
    r->bound = 0.0;
    r->err = (double)diff;
    r->exact_ok = diff == 0;
    snprintf(r->note, sizeof(r->note), "bit-exact: %zu of %zu bytes differ", diff, bytes);
    free(w), free(want), free(got);
}

/* grouped FP4: s = experts N K rows tokens; each row picks a random expert and token. The
 * weights go up in the checkpoint's order and are rearranged there, as the engine does; the
 * reference reads the checkpoint's order. */
static void run_gemm_fp4(const case_t *cs, result_t *r)
{
    int E = cs->s[0], N = cs->s[1], K = cs->s[2], R = cs->s[3], T = cs->s[4];
    float *x = frandv((size_t)T * K, 1.0f);
    size_t wbytes = (size_t)E * N * (K / 2), sbytes = (size_t)E * N * (K / 32);
    uint8_t *w = xmalloc(wbytes), *s = xmalloc(sbytes);
    for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)rnd();
    /* s[5] 1: every 7th scale tiny (2^-127 .. 2^-120: the FP4 MMA kernel's f32 path) */
    for (size_t i = 0; i < sbytes; i++)
        s[i] = (uint8_t)(cs->s[5] && i % 7 == 3 ? irand(8) : 122 + irand(8));
    int *expert = xmalloc((size_t)R * sizeof(int));
    int32_t *offs = xmalloc((size_t)(E + 1) * 4), *rows = xmalloc((size_t)R * 4);
    for (int i = 0; i < R; i++) expert[i] = irand(E);
    int max_rows = 0, at = 0;
    char *touched = calloc((size_t)E, 1);
    for (int e = 0; e < E; e++) {
        offs[e] = at;
        for (int i = 0; i < R; i++)
            if (expert[i] == e) {
                rows[at++] = irand(T);
                touched[e] = 1;
            }
        if (at - offs[e] > max_rows) max_rows = at - offs[e];
    }
    offs[E] = at;
    int n_touched = 0;
    for (int e = 0; e < E; e++) n_touched += touched[e];
    gemm_ctx_t c = {0};
    c.x = dup_bf16(x, (size_t)T * K);
    c.w8 = dup(w, wbytes);
    BT_OK_OR_DIE(bt_cuda_fp4_to_frag((uint8_t *)c.w8, wbytes, 0));
    c.s8 = dup(s, sbytes);
    c.rows = dup(rows, (size_t)R * 4);
    c.offs = dup(offs, (size_t)(E + 1) * 4);
    c.E = E;
    c.N = N;
    c.K = K;
    c.yd = cs->dt;
    c.max_rows = max_rows > 0 ? max_rows : 1;
    if (cs->op == OP_GEMM_FP4_LIST && n_touched > 0) {
        /* s[5] 2: the list padded with -1 slots, as bt_cuda_moe_group leaves it */
        int pad = cs->s[5] == 2 ? 5 : 0;
        int32_t *el = xmalloc((size_t)(n_touched + pad) * 4);
        for (int e = 0, k = 0; e < E; e++)
            if (touched[e]) el[k++] = e;
        for (int k = n_touched; k < n_touched + pad; k++) el[k] = -1;
        c.elist = dup(el, (size_t)(n_touched + pad) * 4);
        c.n_listed = n_touched + pad;
        free(el);
    }
    size_t ysz = (size_t)R * N * (cs->dt == BF16 ? 2 : 4);
    c.y = dalloc(ysz);
    poison(c.y, ysz);
    launch_gemm_fp4(&c);
    float *y = get_act(c.y, (size_t)R * N, cs->dt);
    int *chk = xmalloc((size_t)R * sizeof(int));
    int nr = check_rows(R, (double)R * N * K, chk);
    float *yo = xmalloc((size_t)nr * N * 4), *ref = xmalloc((size_t)nr * N * 4);
    for (int i = 0; i < nr; i++) {
        int row = chk[i], e = 0;
        while (offs[e + 1] <= row) e++;
        const float *xr = x + (size_t)rows[row] * K;
        for (int n = 0; n < N; n++) {
            const uint8_t *wr = w + ((size_t)e * N + n) * (K / 2);
            const uint8_t *sr = s + ((size_t)e * N + n) * (K / 32);
            double acc = 0.0;
            for (int k = 0; k < K; k++) {
                uint8_t b = wr[k / 2];
                float wv = bt_e2m1_to_f32((k & 1) ? b >> 4 : b & 15) * bt_e8m0_to_f32(sr[k / 32]);
                acc += (double)wv * xr[k];
            }
            ref[(size_t)i * N + n] = (float)acc;
            yo[(size_t)i * N + n] = y[(size_t)row * N + n];
        }
    }
    relerr(r, yo, ref, (size_t)nr * N);
    for (size_t i = 0; i < (size_t)R * N; i++)
        if (!isfinite(y[i])) r->finite = 0;
    snprintf(r->note, sizeof(r->note), "max %d rows/expert%s", max_rows,
             nr < R ? ", sampled rows" : "");
    r->bytes = (double)n_touched * N * (K / 2 + K / 32) + 2.0 * R * K + (double)ysz;
    r->flops = 2.0 * R * N * K;
    if (g_perf && cs->perf) r->ms = time_it(launch_gemm_fp4, &c);
    free(x), free(w), free(s), free(expert), free(offs), free(rows), free(touched), free(y);
    free(chk), free(yo), free(ref);
}

/* ---- per-row ops ------------------------------------------------------------------------ */

typedef struct {
    void *y;
    const void *x;
    const float *w;
    bt_cuda_dtype_t dt;
    int rows, n;
} norm_ctx_t;

static void launch_rmsnorm(void *p)
{
    norm_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_rmsnorm(c->y, c->dt, c->x, c->dt, c->w, c->rows, c->n, 1e-6f, 0));
}

static void run_rmsnorm(const case_t *cs, result_t *r)
{
    int rows = cs->s[0], n = cs->s[1];
    size_t tot = (size_t)rows * n, esz = cs->dt == BF16 ? 2 : 4;
    float *x = frandv(tot, 3.0f), *w = cs->s[2] ? frandv((size_t)n, 1.0f) : NULL;
    norm_ctx_t c = {0};
    c.x = dup_act(x, tot, cs->dt);
    c.w = w ? dup(w, (size_t)n * 4) : NULL;
    c.dt = cs->dt;
    c.rows = rows;
    c.n = n;
    c.y = dalloc(tot * esz);
    poison(c.y, tot * esz);
    launch_rmsnorm(&c);
    float *y = get_act(c.y, tot, cs->dt), *ref = xmalloc(tot * 4);
    for (int i = 0; i < rows; i++)
        bt_cpu_rmsnorm(ref + (size_t)i * n, x + (size_t)i * n, w, n, 1e-6f);
    relerr(r, y, ref, tot);
    r->bytes = 2.0 * tot * esz;
    if (g_perf && cs->perf) r->ms = time_it(launch_rmsnorm, &c);
    free(x), free(w), free(y), free(ref);
}

static void run_rope(const case_t *cs, result_t *r)
{
    int rows = cs->s[0], heads = cs->s[1], dim = cs->s[2], half = cs->s[3], inv = cs->s[4];
    size_t tot = (size_t)rows * heads * dim;
    float *x = frandv(tot, 2.0f), *freq = xmalloc((size_t)half * 4);
    int64_t *pos = xmalloc((size_t)rows * 8);
    for (int i = 0; i < half; i++) freq[i] = powf(10000.0f, -(float)i / (float)half);
    for (int i = 0; i < rows; i++) pos[i] = i == 0 ? 0 : (int64_t)(rnd() % 1048576);
    void *dx = dup_act(x, tot, cs->dt);
    BT_OK_OR_DIE(bt_cuda_rope(dx, cs->dt, rows, heads, dim, dup(pos, (size_t)rows * 8),
                              dup(freq, (size_t)half * 4), half, inv, 0));
    float *y = get_act(dx, tot, cs->dt), *cs_ = xmalloc((size_t)half * 4),
          *sn = xmalloc((size_t)half * 4);
    for (int i = 0; i < rows; i++) {
        bt_cpu_rope_angles(cs_, sn, freq, half, pos[i]);
        for (int h = 0; h < heads; h++)
            bt_cpu_rope(x + ((size_t)i * heads + h) * dim, dim, cs_, sn, half, inv);
    }
    relerr(r, y, x, tot);
    free(x), free(freq), free(pos), free(y), free(cs_), free(sn);
}

/* s = rows heads dim norm half fq: bt_cuda_head_finish against bt_cuda_rmsnorm, bt_cuda_rope
 * and bt_cuda_fake_quant launched one after the other (each checked against the CPU on its
 * own above): bit for bit */
static void run_head_finish(const case_t *cs, result_t *r)
{
    int rows = cs->s[0], heads = cs->s[1], dim = cs->s[2], norm = cs->s[3], half = cs->s[4];
    int fq_block = cs->s[5] / 4, kind = cs->s[5] % 4;
    size_t tot = (size_t)rows * heads * dim;
    float *x = frandv(tot, 3.0f), *nw = frandv((size_t)dim, 1.0f);
    float *freq = xmalloc((size_t)(half > 0 ? half : 1) * 4);
    int64_t *pos = xmalloc((size_t)rows * 8);
    for (int i = 0; i < half; i++) freq[i] = powf(10000.0f, -(float)i / (float)half);
    for (int i = 0; i < rows; i++) pos[i] = (int64_t)(rnd() % 100000);
    float *dpos_f = half ? dup(freq, (size_t)half * 4) : NULL;
    int64_t *dpos = half ? dup(pos, (size_t)rows * 8) : NULL;
    float *dnw = dup(nw, (size_t)dim * 4), *a = dup(x, tot * 4), *b = dup(x, tot * 4);
    BT_OK_OR_DIE(bt_cuda_head_finish(a, rows, heads, dim, norm, dnw, 1e-6f, dpos, dpos_f, half,
                                     fq_block, (bt_cuda_fake_quant_t)kind, 0));
    if (norm) BT_OK_OR_DIE(bt_cuda_rmsnorm(b, F32, b, F32, dnw, rows, dim, 1e-6f, 0));
    if (half) BT_OK_OR_DIE(bt_cuda_rope(b, F32, rows, heads, dim, dpos, dpos_f, half, 0, 0));
    if (fq_block)
        BT_OK_OR_DIE(bt_cuda_fake_quant(b, rows * heads, dim, fq_block, (bt_cuda_fake_quant_t)kind, 0));
    float *ya = xmalloc(tot * 4), *yb = xmalloc(tot * 4);
    get(ya, a, tot * 4);
    get(yb, b, tot * 4);
    size_t diff = 0, changed = 0;
    for (size_t i = 0; i < tot; i++) {
        if (memcmp(&ya[i], &yb[i], 4) && !(isnan(ya[i]) && isnan(yb[i]))) diff++;
        if (!isfinite(ya[i])) r->finite = 0;
        changed += ya[i] != x[i];
    }
    r->bound = 0.0;
    r->err = (double)diff;
    r->exact_ok = diff == 0 && changed > 0; /* (and it did something) */
    snprintf(r->note, sizeof(r->note), "bit-exact vs the separate launches: %zu of %zu differ", diff,
             tot);
    free(x), free(nw), free(freq), free(pos), free(ya), free(yb);
}

/* s = rows n block kind special: special mixes NaN, inf, zero blocks, subnormals and ties */
static void run_fake_quant(const case_t *cs, result_t *r)
{
    int rows = cs->s[0], n = cs->s[1], block = cs->s[2], kind = cs->s[3], special = cs->s[4];
    size_t tot = (size_t)rows * n;
    float *x = xmalloc(tot * 4), *ref = xmalloc(tot * 4), *y = xmalloc(tot * 4);
    for (size_t i = 0; i < tot; i++) {
        size_t b = i / (size_t)block;
        x[i] = ldexpf(frand(), (int)(b * 7 % 41) - 20); /* a magnitude per block */
    }
    if (special) {
        static const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f};
        for (size_t i = 0; i < tot; i++) {
            size_t b = i / (size_t)block;
            switch (b % 6) {
            case 0: x[i] = i % (size_t)block == 3 ? NAN : x[i]; break;
            case 1: x[i] = i % (size_t)block == 5 ? -INFINITY : x[i]; break;
            case 2: x[i] = 0.0f; break;
            case 3: x[i] = ldexpf(frand(), -140); break; /* subnormal f32 */
            case 4: x[i] = ties[i % 8] * (i & 1 ? -1.0f : 1.0f); break;
            default: x[i] = frand() * 464.0f; break;
            }
        }
    }
    memcpy(ref, x, tot * 4);
    float *dx = dup(x, tot * 4);
    BT_OK_OR_DIE(bt_cuda_fake_quant(dx, rows, n, block, (bt_cuda_fake_quant_t)kind, 0));
    get(y, dx, tot * 4);
    for (int i = 0; i < rows; i++) {
        float *v = ref + (size_t)i * n;
        if (kind == 0) bt_fake_quant_fp8_ue8m0(v, n, block);
        if (kind == 1) bt_fake_quant_fp4_ue8m0(v, n, block);
        if (kind == 2) bt_fake_quant_fp4_e4m3(v, n, block);
    }
    size_t diff = 0;
    for (size_t i = 0; i < tot; i++) {
        uint32_t a, b;
        memcpy(&a, &y[i], 4);
        memcpy(&b, &ref[i], 4);
        if (a != b && !(isnan(y[i]) && isnan(ref[i]))) diff++;
        if (!isfinite(y[i]) && isfinite(ref[i])) r->finite = 0;
    }
    r->bound = 0.0;
    r->err = (double)diff;
    r->exact_ok = diff == 0;
    snprintf(r->note, sizeof(r->note), "bit-exact: %zu of %zu differ%s", diff, tot,
             special ? " (NaN/inf/0/subnormal/ties)" : "");
    free(x), free(ref), free(y);
}

/* ---- mHC -------------------------------------------------------------------------------- */

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* model.c hc_mix, transcribed with the config as arguments */
static void ref_hc_mix(const float *x, const float *fn, const float *base, const float *scale,
                       int hc, int D, float eps, float hc_eps, int iters, float *pre, float *post,
                       float *comb)
{
    int n = hc * D, mix = (2 + hc) * hc;
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    float m[80];
    for (int k = 0; k < mix; k++) {
        double acc = 0.0;
        for (int i = 0; i < n; i++) acc += (double)fn[(size_t)k * n + i] * (x[i] * r);
        m[k] = (float)acc;
    }
    for (int k = 0; k < hc; k++) {
        pre[k] = sigm(m[k] * scale[0] + base[k]) + hc_eps;
        post[k] = 2.0f * sigm(m[hc + k] * scale[1] + base[hc + k]);
    }
    for (int j = 0; j < hc; j++) {
        float *row = comb + j * hc, mx = -INFINITY, sum = 0.0f;
        for (int k = 0; k < hc; k++) {
            row[k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
            mx = fmaxf(mx, row[k]);
        }
        for (int k = 0; k < hc; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (int k = 0; k < hc; k++) row[k] = row[k] / sum + hc_eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {
                float sum = 0.0f;
                for (int k = 0; k < hc; k++) sum += comb[j * hc + k];
                for (int k = 0; k < hc; k++) comb[j * hc + k] /= sum + hc_eps;
            }
        for (int k = 0; k < hc; k++) {
            float sum = 0.0f;
            for (int j = 0; j < hc; j++) sum += comb[j * hc + k];
            for (int j = 0; j < hc; j++) comb[j * hc + k] /= sum + hc_eps;
        }
    }
}

typedef struct {
    float *pre, *post, *comb, *x, *fn, *base, *scale;
    void *o;
    bt_cuda_dtype_t dt;
    int T, hc, D;
    float *work; /* OP_HC_MIX_WS */
    size_t work_n;
} hc_ctx_t;

static void launch_hc_mix(void *p)
{
    hc_ctx_t *c = p;
    if (c->work)
        BT_OK_OR_DIE(bt_cuda_hc_mix_ws(c->pre, c->post, c->comb, c->x, c->fn, c->base, c->scale,
                                       c->T, c->hc, c->D, 1e-20f, 1e-6f, 20, c->work, c->work_n, 0));
    else
        BT_OK_OR_DIE(bt_cuda_hc_mix(c->pre, c->post, c->comb, c->x, c->fn, c->base, c->scale, c->T,
                                    c->hc, c->D, 1e-20f, 1e-6f, 20, 0));
}

static void launch_hc_expand(void *p)
{
    hc_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_hc_expand(c->x, c->o, c->dt, c->post, c->comb, c->T, c->hc, c->D, 0));
}

static void run_hc_mix(const case_t *cs, result_t *r)
{
    int T = cs->s[0], hc = cs->s[1], D = cs->s[2], mix = (2 + hc) * hc, n = hc * D;
    float *x = frandv((size_t)T * n, 2.0f), *fn = frandv((size_t)mix * n, 0.05f);
    float *base = frandv((size_t)mix, 1.0f), scale[3] = {0.7f, 1.3f, 0.9f};
    hc_ctx_t c = {0};
    c.T = T;
    c.hc = hc;
    c.D = D;
    c.x = dup(x, (size_t)T * n * 4);
    c.fn = dup(fn, (size_t)mix * n * 4);
    c.base = dup(base, (size_t)mix * 4);
    c.scale = dup(scale, 12);
    if (cs->op == OP_HC_MIX_WS) {
        c.work_n = bt_cuda_hc_mix_ws_floats(T, hc, D);
        c.work = dalloc((c.work_n ? c.work_n : 1) * 4);
        poison(c.work, (c.work_n ? c.work_n : 1) * 4);
    }
    size_t outn = (size_t)T * (2 * hc + hc * hc);
    float *dout = dalloc(outn * 4);
    poison(dout, outn * 4);
    c.pre = dout;
    c.post = dout + (size_t)T * hc;
    c.comb = dout + (size_t)2 * T * hc;
    launch_hc_mix(&c);
    float *out = xmalloc(outn * 4), *ref = xmalloc(outn * 4);
    get(out, dout, outn * 4);
    for (int t = 0; t < T; t++)
        ref_hc_mix(x + (size_t)t * n, fn, base, scale, hc, D, 1e-20f, 1e-6f, 20, ref + t * hc,
                   ref + (size_t)T * hc + t * hc, ref + (size_t)2 * T * hc + (size_t)t * hc * hc);
    relerr(r, out, ref, outn);
    if (cs->op == OP_HC_MIX && T >= 4 * 132) {
        /* the first 100 tokens alone take the one-token-a-block kernel: the same bits */
        int T1 = 100;
        size_t n1 = (size_t)T1 * (2 * hc + hc * hc);
        float *d1 = dalloc(n1 * 4), *o1 = xmalloc(n1 * 4);
        poison(d1, n1 * 4);
        hc_ctx_t c1 = c;
        c1.T = T1;
        c1.pre = d1;
        c1.post = d1 + (size_t)T1 * hc;
        c1.comb = d1 + (size_t)2 * T1 * hc;
        launch_hc_mix(&c1);
        get(o1, d1, n1 * 4);
        size_t diff = 0;
        for (int t = 0; t < T1; t++) {
            diff += memcmp(o1 + (size_t)t * hc, out + (size_t)t * hc, (size_t)hc * 4) != 0;
            diff += memcmp(o1 + (size_t)T1 * hc + (size_t)t * hc, out + (size_t)T * hc + (size_t)t * hc,
                           (size_t)hc * 4) != 0;
            diff += memcmp(o1 + (size_t)2 * T1 * hc + (size_t)t * hc * hc,
                           out + (size_t)2 * T * hc + (size_t)t * hc * hc, (size_t)hc * hc * 4) != 0;
        }
        if (diff) r->exact_ok = 0;
        snprintf(r->note, sizeof r->note, "first %d tokens alone: %s", T1,
                 diff ? "DIFFERENT bits" : "same bits");
        free(o1);
    }
    r->bytes = (double)T * n * 4 + (double)mix * n * 4;
    r->flops = 2.0 * T * mix * n;
    if (g_perf && cs->perf) r->ms = time_it(launch_hc_mix, &c);
    free(x), free(fn), free(base), free(out), free(ref);
}

/* s = T hc D: bt_cuda_hc_mix_collapse_ws against bt_cuda_hc_mix_ws then
 * bt_cuda_hc_collapse_norm (each checked against the CPU on its own): bit for bit */
static void run_hc_mix_collapse(const case_t *cs, result_t *r)
{
    int T = cs->s[0], hc = cs->s[1], D = cs->s[2], mix = (2 + hc) * hc, n = hc * D;
    float *x = dup_free(frandv((size_t)T * n, 2.0f), (size_t)T * n);
    float *fn = dup_free(frandv((size_t)mix * n, 0.05f), (size_t)mix * n);
    float *base = dup_free(frandv((size_t)mix, 1.0f), (size_t)mix), scale_h[3] = {0.7f, 1.3f, 0.9f};
    float *scale = dup(scale_h, 12), *w = dup_free(frandv((size_t)T * hc, 1.0f), (size_t)T * hc);
    float *nw = dup_free(frandv((size_t)D, 1.0f), (size_t)D);
    size_t work_n = bt_cuda_hc_mix_ws_floats(T, hc, D), esz = cs->dt == BF16 ? 2 : 4;
    size_t mixn = (size_t)T * (2 * hc + hc * hc), outn = (size_t)T * D;
    float *work = dalloc((work_n ? work_n : 1) * 4);
    float *outs[2][2]; /* [fused, separate][mix, collapse] */
    for (int v = 0; v < 2; v++) {
        outs[v][0] = dalloc(mixn * 4);
        outs[v][1] = dalloc(outn * esz);
        poison(outs[v][0], mixn * 4);
        poison(outs[v][1], outn * esz);
        float *pre = outs[v][0], *post = pre + (size_t)T * hc, *comb = post + (size_t)T * hc;
        poison(work, (work_n ? work_n : 1) * 4);
        if (v == 0) {
            BT_OK_OR_DIE(bt_cuda_hc_mix_collapse_ws(pre, post, comb, x, fn, base, scale, T, hc, D,
                                                    1e-20f, 1e-6f, 20, work, work_n, outs[v][1],
                                                    cs->dt, w, nw, 1e-6f, 0));
        } else {
            BT_OK_OR_DIE(bt_cuda_hc_mix_ws(pre, post, comb, x, fn, base, scale, T, hc, D, 1e-20f,
                                           1e-6f, 20, work, work_n, 0));
            BT_OK_OR_DIE(bt_cuda_hc_collapse_norm(outs[v][1], cs->dt, x, w, nw, T, hc, D, 1e-6f, 0));
        }
    }
    size_t diff = 0, sizes[2] = {mixn * 4, outn * esz};
    for (int k = 0; k < 2; k++) {
        unsigned char *a = xmalloc(sizes[k]), *b = xmalloc(sizes[k]);
        get(a, outs[0][k], sizes[k]);
        get(b, outs[1][k], sizes[k]);
        diff += memcmp(a, b, sizes[k]) != 0;
        if (k == 0)
            for (size_t i = 0; i < mixn; i++) r->finite &= isfinite(((float *)a)[i]) != 0;
        free(a), free(b);
    }
    r->bound = 0.0;
    r->err = (double)diff;
    r->exact_ok = diff == 0;
    snprintf(r->note, sizeof(r->note), "bit-exact vs the separate launches: %s",
             diff ? "DIFFERENT" : "same");
}

/* s = T hc D o-f32 no-norm: bt_cuda_hc_expand_collapse against bt_cuda_hc_expand then
 * bt_cuda_hc_collapse_norm (each checked against the CPU on its own): the streams and the
 * output bit for bit */
static void run_hc_expand_collapse(const case_t *cs, result_t *r)
{
    const int T = cs->s[0], hc = cs->s[1], D = cs->s[2];
    const bt_cuda_dtype_t odt = cs->s[3] ? F32 : cs->dt;
    const size_t nx = (size_t)T * hc * D, no = (size_t)T * D, esz = cs->dt == BF16 ? 2 : 4;
    float *x = frandv(nx, 2.0f), *oh = frandv(no, 1.0f);
    float *post = dup_free(frandv((size_t)T * hc, 2.0f), (size_t)T * hc);
    float *comb = dup_free(frandv((size_t)T * hc * hc, 1.0f), (size_t)T * hc * hc);
    float *w = dup_free(frandv((size_t)T * hc, 1.0f), (size_t)T * hc);
    float *nw = cs->s[4] ? NULL : dup_free(frandv((size_t)D, 1.0f), (size_t)D);
    void *o = dup_act(oh, no, odt);
    unsigned char *h[2][2]; /* [two launches, one][streams, output] */
    float *dx = dalloc(nx * 4);
    void *dout = dalloc(no * esz);
    for (int v = 0; v < 2; v++) {
        CUDA_OK(cudaMemcpy(dx, x, nx * 4, cudaMemcpyHostToDevice));
        poison(dout, no * esz);
        if (v == 0) {
            BT_OK_OR_DIE(bt_cuda_hc_expand(dx, o, odt, post, comb, T, hc, D, 0));
            BT_OK_OR_DIE(bt_cuda_hc_collapse_norm(dout, cs->dt, dx, w, nw, T, hc, D, 1e-6f, 0));
        } else {
            BT_OK_OR_DIE(bt_cuda_hc_expand_collapse(dx, o, odt, post, comb, dout, cs->dt, w, nw, T,
                                                    hc, D, 1e-6f, 0));
        }
        h[v][0] = xmalloc(nx * 4);
        h[v][1] = xmalloc(no * esz);
        get(h[v][0], dx, nx * 4);
        get(h[v][1], dout, no * esz);
    }
    const int xd = memcmp(h[0][0], h[1][0], nx * 4) != 0, od = memcmp(h[0][1], h[1][1], no * esz) != 0;
    for (size_t i = 0; i < no; i++)
        r->finite &= isfinite(esz == 4 ? ((float *)h[1][1])[i]
                                       : bt_bf16_to_f32(((uint16_t *)h[1][1])[i])) != 0;
    r->bound = 0.0;
    r->err = (double)(xd + od);
    r->exact_ok = !xd && !od;
    snprintf(r->note, sizeof r->note, "bit-exact vs the two launches: streams %s, output %s",
             xd ? "DIFFERENT" : "same", od ? "DIFFERENT" : "same");
    free(x), free(oh);
    for (int v = 0; v < 2; v++) free(h[v][0]), free(h[v][1]);
}

static void run_hc_collapse(const case_t *cs, result_t *r)
{
    int T = cs->s[0], hc = cs->s[1], D = cs->s[2];
    float *x = frandv((size_t)T * hc * D, 2.0f), *w = frandv((size_t)T * hc, 1.0f);
    float *nw = frandv((size_t)D, 1.0f);
    size_t esz = cs->dt == BF16 ? 2 : 4;
    void *dout = dalloc((size_t)T * D * esz);
    poison(dout, (size_t)T * D * esz);
    BT_OK_OR_DIE(bt_cuda_hc_collapse_norm(dout, cs->dt, dup(x, (size_t)T * hc * D * 4),
                                          dup(w, (size_t)T * hc * 4), dup(nw, (size_t)D * 4), T,
                                          hc, D, 1e-20f, 0));
    float *y = get_act(dout, (size_t)T * D, cs->dt), *ref = xmalloc((size_t)T * D * 4);
    for (int t = 0; t < T; t++) { /* model.c hc_collapse_norm */
        float *o = ref + (size_t)t * D;
        for (int d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int s = 0; s < hc; s++) acc += w[t * hc + s] * x[((size_t)t * hc + s) * D + d];
            o[d] = acc;
        }
        bt_cpu_rmsnorm(o, o, nw, D, 1e-20f);
    }
    relerr(r, y, ref, (size_t)T * D);
    free(x), free(w), free(nw), free(y), free(ref);
}

static void run_hc_mean(const case_t *cs, result_t *r)
{
    const int T = cs->s[0], hc = cs->s[1], D = cs->s[2], weighted = cs->s[4];
    const int64_t ld = D + cs->s[3];
    const size_t n = (size_t)T * ld;
    float *x = frandv((size_t)T * hc * D, 2.0f), *w = weighted ? frandv((size_t)T * hc, 1.0f) : NULL;
    float *before = frandv(n, 1.0f), *ref = xmalloc(n * 4), *y = xmalloc(n * 4);
    float *dout = dup(before, n * 4);
    BT_OK_OR_DIE(bt_cuda_hc_collapse(dout, ld, dup(x, (size_t)T * hc * D * 4),
                                     w ? dup(w, (size_t)T * hc * 4) : NULL, T, hc, D, 0));
    get(y, dout, n * 4);
    memcpy(ref, before, n * 4);
    for (int t = 0; t < T; t++) /* model.c hc_collapse: in stream order, the mean divided last */
        for (int d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int k = 0; k < hc; k++)
                acc += w ? w[t * hc + k] * x[((size_t)t * hc + k) * D + d] : x[((size_t)t * hc + k) * D + d];
            ref[(size_t)t * ld + d] = w ? acc : acc / (float)hc;
        }
    relerr(r, y, ref, n);
    /* the mean's sums and division are the CPU's, bit for bit; the row's other columns are
     * untouched either way (a product may fuse into an FMA on the GPU) */
    for (size_t i = 0; i < n; i++)
        if ((i % (size_t)ld >= (size_t)D || !w) && memcmp(&y[i], &ref[i], 4)) r->exact_ok = 0;
    snprintf(r->note, sizeof r->note, "%s, the row's other columns untouched",
             w ? "weighted" : "mean bit-exact");
    free(x), free(w), free(before), free(ref), free(y);
}

static void run_add_rows(const case_t *cs, result_t *r)
{
    const int rows = cs->s[0], width = cs->s[1];
    const int64_t ldy = width + cs->s[2], ldx = width + cs->s[3];
    const size_t ny = (size_t)rows * ldy, nx = (size_t)rows * ldx;
    float *y0 = frandv(ny, 4.0f), *x = frandv(nx, 4.0f), *y = xmalloc(ny * 4), *ref = xmalloc(ny * 4);
    memcpy(ref, y0, ny * 4);
    float *dy = dup(y0, ny * 4);
    BT_OK_OR_DIE(bt_cuda_add_rows(dy, ldy, dup(x, nx * 4), ldx, rows, width, 0));
    get(y, dy, ny * 4);
    for (int i = 0; i < rows; i++) /* model.c's draft: row[v] += bias[v] */
        for (int j = 0; j < width; j++) ref[(size_t)i * ldy + j] += x[(size_t)i * ldx + j];
    relerr(r, y, ref, ny);
    /* one float add each: bit for bit the host's; the pads between rows untouched */
    for (size_t i = 0; i < ny; i++)
        if (memcmp(&y[i], &ref[i], 4)) r->exact_ok = 0;
    snprintf(r->note, sizeof r->note, "bit-exact, the pads untouched");
    free(y0), free(x), free(y), free(ref);
}

/* bt_cuda_act_quant against kernels/cpu/quant.c's bt_fake_quant_fp8_ue8m0 on the same values
 * (bf16 inputs widened): bit for bit, NaNs as NaNs; the output poisoned first */
static void run_act_quant(const case_t *cs, result_t *r)
{
    const int rows = cs->s[0], K = cs->s[1], ldx = K + cs->s[2], xbf = cs->s[3], ybf = cs->s[4];
    const int special = cs->s[5] & 1, in_place = (cs->s[5] & 2) != 0;
    const size_t nx = (size_t)rows * ldx, ny = (size_t)rows * K;
    float *x = xmalloc(nx * 4), *ref = xmalloc(ny * 4);
    for (size_t i = 0; i < nx; i++) /* a magnitude per block of 32, 2^-20 .. 2^20 */
        x[i] = ldexpf(frand(), (int)((i % (size_t)ldx) / 32 * 7 % 41) - 20);
    if (special) {
        static const float ties[] = {0.5f, 1.0625f, 3.25f, 448.0f, 464.0f, 240.0f, 15.5f, 1e-6f};
        for (size_t i = 0; i < nx; i++) {
            const size_t b = (i % (size_t)ldx) / 32;
            switch (b % 5) {
            case 0: x[i] = i % 32 == 3 ? NAN : x[i]; break;
            case 1: x[i] = i % 32 == 5 ? -INFINITY : x[i]; break;
            case 2: x[i] = 0.0f; break;
            case 3: x[i] = ties[i % 8] * (i & 1 ? -1.0f : 1.0f); break;
            default: break;
            }
        }
    }
    uint16_t *xb = xmalloc(nx * 2);
    for (size_t i = 0; i < nx; i++) {
        xb[i] = bt_f32_to_bf16(x[i]);
        if (xbf) x[i] = bt_bf16_to_f32(xb[i]); /* the values the kernel reads */
    }
    for (int i = 0; i < rows; i++) {
        memcpy(ref + (size_t)i * K, x + (size_t)i * ldx, (size_t)K * 4);
        bt_fake_quant_fp8_ue8m0(ref + (size_t)i * K, K, 32);
    }
    void *dx = xbf ? dup(xb, nx * 2) : dup(x, nx * 4), *dy = dx;
    if (!in_place) {
        dy = dalloc(ny * (ybf ? 2 : 4));
        poison(dy, ny * (ybf ? 2 : 4));
    }
    BT_OK_OR_DIE(bt_cuda_act_quant(dy, ybf ? BF16 : F32, dx, xbf ? BF16 : F32, rows, K, ldx, 0));
    float *y = get_act(dy, ny, ybf ? BF16 : F32);
    size_t diff = 0;
    for (size_t i = 0; i < ny; i++) {
        if (!isnan(y[i]) || !isnan(ref[i]))
            diff += memcmp(&y[i], &ref[i], 4) != 0;
        if (!isfinite(y[i]) && isfinite(ref[i])) r->finite = 0;
    }
    r->bound = 0.0;
    r->err = (double)diff;
    r->exact_ok = diff == 0;
    snprintf(r->note, sizeof r->note, "bit-exact with the CPU: %zu of %zu differ", diff, ny);
    free(x), free(xb), free(ref), free(y);
}

static void run_hc_expand(const case_t *cs, result_t *r)
{
    int T = cs->s[0], hc = cs->s[1], D = cs->s[2];
    size_t nx = (size_t)T * hc * D;
    float *x = frandv(nx, 2.0f), *o = frandv((size_t)T * D, 1.0f);
    float *post = frandv((size_t)T * hc, 2.0f), *comb = frandv((size_t)T * hc * hc, 1.0f);
    hc_ctx_t c = {0};
    c.T = T;
    c.hc = hc;
    c.D = D;
    c.dt = cs->dt;
    c.x = dup(x, nx * 4);
    c.o = dup_act(o, (size_t)T * D, cs->dt);
    c.post = dup(post, (size_t)T * hc * 4);
    c.comb = dup(comb, (size_t)T * hc * hc * 4);
    launch_hc_expand(&c);
    float *y = xmalloc(nx * 4);
    get(y, c.x, nx * 4);
    for (int t = 0; t < T; t++) { /* model.c hc_expand */
        float *xt = x + (size_t)t * hc * D, res[8];
        for (int d = 0; d < D; d++) {
            for (int j = 0; j < hc; j++) res[j] = xt[j * D + d];
            for (int k = 0; k < hc; k++) {
                float acc = 0.0f;
                for (int j = 0; j < hc; j++) acc += comb[t * hc * hc + j * hc + k] * res[j];
                xt[k * D + d] = post[t * hc + k] * o[(size_t)t * D + d] + acc;
            }
        }
    }
    relerr(r, y, x, nx);
    r->bytes = 8.0 * nx + (double)T * D * (cs->dt == BF16 ? 2 : 4);
    if (g_perf && cs->perf) r->ms = time_it(launch_hc_expand, &c);
    free(x), free(o), free(post), free(comb), free(y);
}

/* ---- attention -------------------------------------------------------------------------- */

typedef struct {
    void *out, *q, *win, *comp;
    int32_t *widx, *wn, *sel, *sn;
    float *sink, *freq;
    int64_t *pos;
    int T, H, dim, half, W, S;
    bt_cuda_dtype_t dt;
    float *work; /* OP_ATTENTION_WS */
    size_t work_floats;
    bool tc; /* OP_ATTENTION_TC */
    bool flash; /* OP_ATTENTION_FLASH: keys bf16, q and out dt */
    const bt_cuda_attention_batch_t *batch; /* OP_ATTENTION_BATCH */
} att_ctx_t;

static void launch_attention(void *p)
{
    att_ctx_t *c = p;
    if (c->flash)
        BT_OK_OR_DIE(bt_cuda_attention_flash(c->out, c->q, c->dt, c->win, c->widx, c->wn, c->W,
                                             c->comp, c->sel, c->sn, c->S, c->sink, c->pos,
                                             c->freq, c->half, c->T, c->H, c->dim, NULL, 0));
    else if (c->tc && c->work)
        BT_OK_OR_DIE(bt_cuda_attention_tc_ws(c->out, c->q, c->win, c->widx, c->wn, c->W, c->comp,
                                             c->sel, c->sn, c->S, c->sink, c->pos, c->freq, c->half,
                                             c->dt, c->T, c->H, c->dim, c->work, c->work_floats,
                                             c->batch, 0));
    else if (c->tc)
        BT_OK_OR_DIE(bt_cuda_attention_tc(c->out, c->q, c->win, c->widx, c->wn, c->W, c->comp, c->sel,
                                          c->sn, c->S, c->sink, c->pos, c->freq, c->half, c->dt, c->T,
                                          c->H, c->dim, 0));
    else if (c->work)
        BT_OK_OR_DIE(bt_cuda_attention_ws(c->out, c->q, c->win, c->widx, c->wn, c->W, c->comp, c->sel,
                                          c->sn, c->S, c->sink, c->pos, c->freq, c->half, c->dt, c->T,
                                          c->H, c->dim, c->work, c->work_floats, c->batch, 0));
    else
        BT_OK_OR_DIE(bt_cuda_attention(c->out, c->q, c->win, c->widx, c->wn, c->W, c->comp, c->sel,
                                       c->sn, c->S, c->sink, c->pos, c->freq, c->half, c->dt, c->T,
                                       c->H, c->dim, 0));
}

static void run_attention(const case_t *cs, result_t *r)
{
    int T = cs->s[0], H = cs->s[1], dim = cs->s[2], half = cs->s[3], W = cs->s[4], S = cs->s[5];
    bool flash = cs->op == OP_ATTENTION_FLASH;
    bool tc = cs->op == OP_ATTENTION_TC || cs->op == OP_ATTENTION_TC_WS ||
              cs->op == OP_ATTENTION_TC_BATCH || flash;
    bool pooled = cs->op == OP_ATTENTION_BATCH || cs->op == OP_ATTENTION_TC_BATCH;
    bool no_sel = S < 0; /* no_sel: sel_n, sel, comp_kv NULL */
    if (no_sel) S = 0;
    int NW = W + 50, NC = S + 300, Sst = S > 0 ? S : 1;
    /* pooled: token t's window rows at pool + t * RS, its compressed ones NW rows into region
     * T - 1 - t (one base pointer each, per-token offsets, as the model's per-sequence caches);
     * the regions hold different keys, so a token reading another's, or one offset for the
     * other, fails the reference */
    size_t RS = pooled ? (size_t)(NW + NC) * dim + 8 : 0;
    float *pool = pooled ? frandv((size_t)T * RS, 1.0f) : NULL;
    int64_t *woff = xmalloc((size_t)T * 8), *coff = xmalloc((size_t)T * 8);
    for (int t = 0; t < T; t++) {
        woff[t] = (int64_t)(t * RS);
        coff[t] = pooled && t % 3 == 2 ? -1 : (int64_t)((pooled ? T - 1 - t : t) * RS); /* -1: none */
    }
    float *q = frandv((size_t)T * H * dim, 1.0f);
    float *win = pooled ? pool : frandv((size_t)NW * dim, 1.0f);
    float *comp = pooled ? pool + (size_t)NW * dim : frandv((size_t)NC * dim, 1.0f);
    float *sink = frandv((size_t)H, 2.0f);
    float *freq = xmalloc((size_t)(half > 0 ? half : 1) * 4);
    for (int i = 0; i < half; i++) freq[i] = powf(10000.0f, -(float)i / (float)half);
    int32_t *widx = xmalloc((size_t)T * W * 4), *wn = xmalloc((size_t)T * 4);
    int32_t *sel = xmalloc((size_t)T * Sst * 4), *sn = xmalloc((size_t)T * 4);
    int64_t *pos = xmalloc((size_t)T * 8);
    long keys = 0;
    for (int t = 0; t < T; t++) {
        wn[t] = t == 0 ? W : 1 + irand(W);
        sn[t] = S > 0 ? (t == 0 ? S : irand(S + 1)) : 0;
        if (tc && cs->perf) { /* the model's prefill: every token its full lists */
            wn[t] = W;
            sn[t] = S;
        } else if (tc && t % 4 == 1) { /* a single key */
            wn[t] = 1;
            sn[t] = 0;
        } else if (tc && t % 4 == 2 && S > 0) { /* selected keys only (either list may be empty) */
            wn[t] = 0;
            sn[t] = 1 + irand(S);
        } else if (cs->op == OP_ATTENTION_FLASH && t == 3) { /* no keys at all: the sink alone */
            wn[t] = 0;
            sn[t] = 0;
        }
        for (int j = 0; j < W; j++) widx[(size_t)t * W + j] = irand(NW);
        for (int j = 0; j < Sst; j++) sel[(size_t)t * Sst + j] = irand(NC);
        pos[t] = (int64_t)(rnd() % 1000000);
        if (pooled && t % 5 == 3) sn[t] = 0; /* offsets, but no picks (the model's sequences without) */
        keys += wn[t] + (coff[t] < 0 ? 0 : sn[t]);
    }
    att_ctx_t c = {0};
    c.T = T, c.H = H, c.dim = dim, c.half = half, c.W = W, c.S = Sst, c.dt = cs->dt;
    c.q = dup_act(q, (size_t)T * H * dim, cs->dt);
    size_t esz = cs->dt == BF16 ? 2 : 4, on = (size_t)T * H * dim;
    bt_cuda_attention_batch_t batch = {0};
    if (pooled) {
        c.win = dup_act(pool, (size_t)T * RS, cs->dt);
        c.comp = (char *)c.win + (size_t)NW * dim * esz;
        batch.win_off = dup(woff, (size_t)T * 8);
        batch.comp_off = dup(coff, (size_t)T * 8);
        batch.split_per_token = true;
        c.batch = &batch;
    } else {
        c.win = dup_act(win, (size_t)NW * dim, flash ? BF16 : cs->dt);
        c.comp = dup_act(comp, (size_t)NC * dim, flash ? BF16 : cs->dt);
    }
    c.widx = dup(widx, (size_t)T * W * 4);
    c.wn = dup(wn, (size_t)T * 4);
    c.sel = dup(sel, (size_t)T * Sst * 4);
    c.sn = dup(sn, (size_t)T * 4);
    c.sink = dup(sink, (size_t)H * 4);
    c.freq = dup(freq, (size_t)(half > 0 ? half : 1) * 4);
    c.pos = dup(pos, (size_t)T * 8);
    c.tc = tc;
    c.flash = flash;
    if (no_sel) {
        c.comp = NULL;
        c.sel = c.sn = NULL;
        c.S = 0;
    }
    /* q and keys go in as bf16 (f32 inputs rounded by the kernel) and so do the
     * probabilities: bf16-level against the f32 reference whatever the dtype */
    if (tc) r->bound = bound_for(BF16);
    if (cs->op == OP_ATTENTION_WS) {
        c.work_floats = bt_cuda_attention_ws_floats(T, H, dim, W + Sst);
        c.work = dalloc(c.work_floats * 4);
        poison(c.work, c.work_floats * 4);
        snprintf(r->note, sizeof r->note, "%zu splits", c.work_floats / ((size_t)T * H * (dim + 2)));
    }
    if (cs->op == OP_ATTENTION_TC_WS) {
        c.work_floats = bt_cuda_attention_tc_ws_floats(T, H, dim, W + Sst);
        if (c.work_floats == 0) { /* the case would test the unsplit kernel again */
            fprintf(stderr, "attention_tc_ws: no splits for this shape\n");
            exit(1);
        }
        c.work = dalloc(c.work_floats * 4);
        poison(c.work, c.work_floats * 4);
        snprintf(r->note, sizeof r->note, "%zu splits", c.work_floats / ((size_t)T * H * (dim + 2)));
    }
    if (pooled) { /* split per token: a lone token's splits for every token */
        c.work_floats = (size_t)T * (tc ? bt_cuda_attention_tc_ws_floats(1, H, dim, W + Sst)
                                        : bt_cuda_attention_ws_floats(1, H, dim, W + Sst));
        if (c.work_floats == 0) {
            fprintf(stderr, "attention batch: no splits for this shape\n");
            exit(1);
        }
        c.work = dalloc(c.work_floats * 4);
        poison(c.work, c.work_floats * 4);
    }
    c.out = dalloc(on * esz);
    poison(c.out, on * esz);
    launch_attention(&c);
    int alone_diff = -1;
    if (pooled) { /* each token launched alone: the same bits (batch invariance) */
        unsigned char *whole = xmalloc(on * esz), *alone = xmalloc(on * esz);
        get(whole, c.out, on * esz);
        void *dalone = dalloc(on * esz);
        poison(dalone, on * esz);
        alone_diff = 0;
        for (int t = 0; t < T; t++) {
            att_ctx_t one = c;
            bt_cuda_attention_batch_t b1 = batch;
            size_t ro = (size_t)t * H * dim * esz;
            one.T = 1;
            one.q = (char *)c.q + ro;
            one.out = (char *)dalone + ro;
            one.widx = c.widx + (size_t)t * W;
            one.wn = c.wn + t;
            one.sel = c.sel ? c.sel + (size_t)t * Sst : NULL;
            one.sn = c.sn ? c.sn + t : NULL;
            one.pos = c.pos + t;
            b1.win_off = batch.win_off + t;
            b1.comp_off = batch.comp_off + t;
            one.batch = &b1;
            launch_attention(&one);
        }
        get(alone, dalone, on * esz);
        for (int t = 0; t < T; t++)
            alone_diff += memcmp(whole + (size_t)t * H * dim * esz, alone + (size_t)t * H * dim * esz,
                                 (size_t)H * dim * esz) != 0;
        free(whole), free(alone);
    }
    float *y = get_act(c.out, on, cs->dt), *ref = xmalloc(on * 4);
    float *p = xmalloc((size_t)(W + S + 1) * 4), *cs_ = xmalloc((size_t)(half + 1) * 4),
          *sn_ = xmalloc((size_t)(half + 1) * 4);
    float scale = 1.0f / sqrtf((float)dim);
    int *chk = xmalloc((size_t)T * sizeof(int));
    int nchk = check_rows(T, (double)T * H * (W + S) * dim, chk); /* tokens checked */
    for (int i = 0; i < nchk; i++) { /* model.c attend_token */
        int t = chk[i], n = wn[t] + (coff[t] < 0 ? 0 : sn[t]);
        const float *wt = win + (pooled ? woff[t] : 0), *ct = comp + (pooled && coff[t] > 0 ? coff[t] : 0);
        bt_cpu_rope_angles(cs_, sn_, freq, half, pos[t]);
        for (int h = 0; h < H; h++) {
            const float *qh = q + ((size_t)t * H + h) * dim;
            float mx = sink[h], sum = 0.0f;
            for (int j = 0; j < n; j++) {
                const float *k = j < wn[t] ? wt + (size_t)widx[(size_t)t * W + j] * dim
                                           : ct + (size_t)sel[(size_t)t * Sst + j - wn[t]] * dim;
                p[j] = bt_cpu_dot(qh, k, dim) * scale;
                mx = fmaxf(mx, p[j]);
            }
            for (int j = 0; j < n; j++) {
                p[j] = expf(p[j] - mx);
                sum += p[j];
            }
            sum += expf(sink[h] - mx);
            float *o = ref + ((size_t)t * H + h) * dim;
            for (int d = 0; d < dim; d++) o[d] = 0.0f;
            for (int j = 0; j < n; j++) {
                const float *k = j < wn[t] ? wt + (size_t)widx[(size_t)t * W + j] * dim
                                           : ct + (size_t)sel[(size_t)t * Sst + j - wn[t]] * dim;
                for (int d = 0; d < dim; d++) o[d] += (p[j] / sum) * k[d];
            }
            bt_cpu_rope(o, dim, cs_, sn_, half, 1);
        }
    }
    if (nchk < T) { /* compare the checked tokens' rows; every row must be finite */
        size_t rl = (size_t)H * dim;
        float *yo = xmalloc((size_t)nchk * rl * 4), *ro = xmalloc((size_t)nchk * rl * 4);
        for (int i = 0; i < nchk; i++) {
            memcpy(yo + i * rl, y + (size_t)chk[i] * rl, rl * 4);
            memcpy(ro + i * rl, ref + (size_t)chk[i] * rl, rl * 4);
        }
        relerr(r, yo, ro, (size_t)nchk * rl);
        for (size_t i = 0; i < on; i++)
            if (!isfinite(y[i])) r->finite = 0;
        free(yo), free(ro);
    } else {
        relerr(r, y, ref, on);
    }
    if (nchk < T || (tc && cs->perf))
        snprintf(r->note, sizeof r->note, "%d of %d tokens checked%s", nchk, T,
                 tc && cs->perf ? ", full key lists" : "");
    if (pooled) {
        r->exact_ok = alone_diff == 0;
        snprintf(r->note, sizeof r->note, "pooled, %zu splits a token; %d of %d tokens differ alone",
                 c.work_floats / ((size_t)T * H * (dim + 2)), alone_diff, T);
    }
    r->bytes = (double)keys * dim * esz + 2.0 * on * esz;
    r->flops = 4.0 * keys * H * dim;
    if (g_perf && cs->perf) r->ms = time_it(launch_attention, &c);
    if (pooled) free(pool);
    else free(win), free(comp);
    free(q), free(sink), free(freq), free(widx), free(wn), free(sel), free(woff), free(coff);
    free(sn), free(pos), free(y), free(ref), free(p), free(cs_), free(sn_), free(chk);
}

/* ---- indexer ---------------------------------------------------------------------------- */

typedef struct {
    float *scores, *q, *w, *keys;
    int64_t *vis;
    int32_t *out, *out_n;
    int T, heads, dim, n, k;
    int64_t *key_off; /* OP_INDEX_SETS: token t's key set at keys + key_off[t], n_keys[t] rows */
    int32_t *n_keys;
    bool tc; /* OP_INDEX_TC, OP_INDEX_SETS_TC */
} ix_ctx_t;

static void launch_index(void *p)
{
    ix_ctx_t *c = p;
    if (c->tc)
        BT_OK_OR_DIE(bt_cuda_index_scores_tc(c->scores, c->q, c->w, c->keys, c->key_off,
                                             c->n_keys, c->vis, c->T, c->heads, c->dim, c->n, 0));
    else if (c->key_off)
        BT_OK_OR_DIE(bt_cuda_index_scores_sets(c->scores, c->q, c->w, c->keys, c->key_off, c->n_keys, c->vis,
                                               c->T, c->heads, c->dim, c->n, 0));
    else
        BT_OK_OR_DIE(
            bt_cuda_index_scores(c->scores, c->q, c->w, c->keys, c->vis, c->T, c->heads, c->dim, c->n, 0));
}

static void launch_topk(void *p)
{
    ix_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_topk(c->out, c->out_n, c->k, c->scores, c->T, c->n, c->k, 0));
}

static void run_index(const case_t *cs, result_t *r)
{
    int T = cs->s[0], H = cs->s[1], dim = cs->s[2], n = cs->s[3], raw = cs->s[4];
    bool tc = cs->op == OP_INDEX_TC || cs->op == OP_INDEX_SETS_TC;
    /* every token its own key set of n_keys[t] <= n rows */
    bool sets = cs->op == OP_INDEX_SETS || cs->op == OP_INDEX_SETS_TC;
    size_t key_rows = sets ? (size_t)T * n : (size_t)n;
    float *q = frandv((size_t)T * H * dim, 1.0f), *w = frandv((size_t)T * H, 0.2f);
    float *keys = frandv(key_rows * dim, 1.0f);
    if (tc && !raw) {
        /* the model's FP4 rounding of the indexer's q and keys (per head row, block 32), then
         * bf16 (a no-op on FP4 values; dims off 32, which the fake quant leaves alone, made
         * bf16 too): the kernel's bf16 products are then exact and only the order of the fp32
         * sums differs from the f32 reference, so the f32 bound holds */
        float *v[2] = {q, keys};
        size_t rows[2] = {(size_t)T * H, key_rows};
        for (int a = 0; a < 2; a++)
            for (size_t i = 0; i < rows[a]; i++) {
                float *x = v[a] + i * dim;
                bt_fake_quant_fp4_ue8m0(x, dim, 32);
                for (int d = 0; d < dim; d++) x[d] = bt_bf16_to_f32(bt_f32_to_bf16(x[d]));
            }
    }
    if (tc && raw) r->bound = bound_for(BF16); /* q and keys rounded to bf16 by the kernel */
    int64_t *vis = xmalloc((size_t)T * 8), *koff = xmalloc((size_t)T * 8);
    int32_t *nk = xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) {
        vis[t] = t == 0 ? n : irand(n + 1);
        nk[t] = sets ? (t == 1 ? n : 1 + irand(n)) : n;
        koff[t] = sets ? (int64_t)(T - 1 - t) * n * dim : 0; /* sets stored in reverse order */
        if (tc) { /* causal-like (the last token sees every key), off the key tiles; some
                   * tokens see nothing, some key sets are empty */
            int64_t v = (int64_t)n * (t + 1) / T;
            if (t < T - 1) v = t % 5 == 3 ? 0 : v - irand((int)(v < 127 ? v : 127) + 1);
            vis[t] = v;
            if (sets && t % 4 == 2) nk[t] = 0;
        }
    }
    ix_ctx_t c = {0};
    c.tc = tc;
    if (sets) {
        c.key_off = dup(koff, (size_t)T * 8);
        c.n_keys = dup(nk, (size_t)T * 4);
    }
    c.T = T, c.heads = H, c.dim = dim, c.n = n;
    c.q = dup(q, (size_t)T * H * dim * 4);
    c.w = dup(w, (size_t)T * H * 4);
    c.keys = dup(keys, key_rows * dim * 4);
    c.vis = dup(vis, (size_t)T * 8);
    c.scores = dalloc((size_t)T * n * 4);
    poison(c.scores, (size_t)T * n * 4);
    launch_index(&c);
    float *y = xmalloc((size_t)T * n * 4), *ref = xmalloc((size_t)T * n * 4);
    memset(ref, 0, (size_t)T * n * 4); /* every entry is written below; gcc cannot tell */
    get(y, c.scores, (size_t)T * n * 4);
    float scale = 1.0f / sqrtf((float)dim);
    size_t bad_inf = 0;
    int *chk = xmalloc((size_t)T * sizeof(int));
    int nchk = check_rows(T, (double)T * H * dim * n, chk); /* tokens whose scores are computed */
    char *checked = calloc((size_t)T, 1);
    for (int i = 0; i < nchk; i++) checked[chk[i]] = 1;
    for (int t = 0; t < T; t++) /* model.c index_token's scores */
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            if (j >= vis[t] || j >= nk[t]) {
                ref[(size_t)t * n + j] = -INFINITY;
                if (y[(size_t)t * n + j] != -INFINITY) bad_inf++;
                y[(size_t)t * n + j] = 0.0f; /* compare the finite part below */
                ref[(size_t)t * n + j] = 0.0f;
                continue;
            }
            if (!checked[t]) { /* not recomputed: finite is all that is checked */
                if (!isfinite(y[(size_t)t * n + j])) r->finite = 0;
                y[(size_t)t * n + j] = ref[(size_t)t * n + j] = 0.0f;
                continue;
            }
            for (int h = 0; h < H; h++) {
                float d = bt_cpu_dot(q + ((size_t)t * H + h) * dim, keys + koff[t] + (size_t)j * dim, dim);
                acc += (fmaxf(d, 0.0f) * scale) * w[t * H + h];
            }
            ref[(size_t)t * n + j] = acc;
        }
    relerr(r, y, ref, (size_t)T * n);
    r->exact_ok = bad_inf == 0;
    snprintf(r->note, sizeof(r->note), "invisible -> -inf: %zu wrong", bad_inf);
    if (nchk < T)
        snprintf(r->note + strlen(r->note), sizeof(r->note) - strlen(r->note),
                 "; %d of %d tokens checked", nchk, T);
    r->bytes = (double)n * dim * 4 + (double)T * n * 4;
    r->flops = 2.0 * T * n * H * dim;
    if (g_perf && cs->perf) r->ms = time_it(launch_index, &c);
    free(q), free(w), free(keys), free(vis), free(koff), free(nk), free(y), free(ref), free(chk);
    free(checked);
}

static const float *g_sort_scores;
static int cmp_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_sort_scores[i], y = g_sort_scores[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}
static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* s = T n k ties: ties quantizes the scores to a few values */
static void run_topk(const case_t *cs, result_t *r)
{
    int T = cs->s[0], n = cs->s[1], k = cs->s[2], ties = cs->s[3];
    float *s = frandv((size_t)T * n, 10.0f);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < n; j++) {
            float *v = &s[(size_t)t * n + j];
            if (ties) *v = roundf(*v);
            if (t == 1 % T && j >= n / 3) *v = -INFINITY; /* a row with invisible entries */
        }
    ix_ctx_t c = {0};
    c.T = T, c.n = n, c.k = k;
    c.scores = dup(s, (size_t)T * n * 4);
    c.out = dalloc((size_t)T * k * 4);
    c.out_n = dalloc((size_t)T * 4);
    poison_int(c.out, (size_t)T * k * 4);
    poison_int(c.out_n, (size_t)T * 4);
    launch_topk(&c);
    int32_t *out = xmalloc((size_t)T * k * 4), *out_n = xmalloc((size_t)T * 4);
    get(out, c.out, (size_t)T * k * 4);
    get(out_n, c.out_n, (size_t)T * 4);
    int *idx = xmalloc((size_t)n * sizeof(int)), *want = xmalloc((size_t)k * sizeof(int));
    int wrong = 0;
    for (int t = 0; t < T; t++) {
        g_sort_scores = s + (size_t)t * n;
        for (int j = 0; j < n; j++) idx[j] = j;
        qsort(idx, (size_t)n, sizeof(int), cmp_desc);
        int kk = k < n ? k : n, m = 0;
        for (int i = 0; i < kk; i++)
            if (g_sort_scores[idx[i]] > -INFINITY) want[m++] = idx[i];
        qsort(want, (size_t)m, sizeof(int), cmp_int);
        if (out_n[t] != m) wrong++;
        for (int i = 0; i < k; i++)
            if (out[(size_t)t * k + i] != (i < m ? want[i] : -1)) {
                wrong++;
                break;
            }
    }
    r->bound = 0.0;
    r->err = wrong;
    r->exact_ok = wrong == 0;
    snprintf(r->note, sizeof(r->note), "exact: %d of %d rows differ", wrong, T);
    r->bytes = (double)T * n * 4 * 5; /* four radix passes and the output pass */
    if (g_perf && cs->perf) r->ms = time_it(launch_topk, &c);
    free(s), free(out), free(out_n), free(idx), free(want);
}

/* ---- MoE -------------------------------------------------------------------------------- */

typedef struct {
    int32_t *idx;
    float *wts, *logits, *bias;
    int T, E, k;
} route_ctx_t;

static void launch_route(void *p)
{
    route_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_moe_route(c->idx, c->wts, c->logits, c->bias, c->T, c->E, c->k, 1.0f, 1,
                                   1.5f, 0));
}

static void run_moe_route(const case_t *cs, result_t *r)
{
    int T = cs->s[0], E = cs->s[1], K = cs->s[2];
    float *logits = frandv((size_t)T * E, 4.0f), *bias = frandv((size_t)E, 0.3f);
    for (int e = 0; e < E; e += 7) logits[e] = 25.0f + frand(); /* softplus's linear branch */
    route_ctx_t c = {0};
    c.T = T, c.E = E, c.k = K;
    c.logits = dup(logits, (size_t)T * E * 4);
    c.bias = dup(bias, (size_t)E * 4);
    c.idx = dalloc((size_t)T * K * 4);
    c.wts = dalloc((size_t)T * K * 4);
    poison_int(c.idx, (size_t)T * K * 4);
    poison(c.wts, (size_t)T * K * 4);
    launch_route(&c);
    int32_t *idx = xmalloc((size_t)T * K * 4);
    float *wts = xmalloc((size_t)T * K * 4), *ref = xmalloc((size_t)T * K * 4);
    get(idx, c.idx, (size_t)T * K * 4);
    get(wts, c.wts, (size_t)T * K * 4);
    float *sc = xmalloc((size_t)E * 4), *bs = xmalloc((size_t)E * 4);
    int *order = xmalloc((size_t)E * sizeof(int)), wrong = 0, tied = 0;
    for (int t = 0; t < T; t++) { /* model.c moe_token's routing */
        for (int e = 0; e < E; e++) {
            sc[e] = sqrtf(bt_softplusf(logits[(size_t)t * E + e] / 1.0f));
            bs[e] = sc[e] + bias[e];
            order[e] = e;
        }
        g_sort_scores = bs;
        qsort(order, (size_t)E, sizeof(int), cmp_desc);
        /* a pick other than the host's is a tie when its biased score is the host's within
         * rounding: the GPU's expf/log1pf differ from libm's by an ulp or two, so two experts
         * that close may swap (2 of 24576 picks over 4096 random tokens); the weights are then
         * checked for the GPU's own picks */
        const int32_t *g = idx + (size_t)t * K;
        float sum = 0.0f;
        for (int i = 0; i < K; i++) {
            if (g[i] < 0 || g[i] >= E) {
                wrong++;
                continue;
            }
            sum += sc[g[i]];
            if (g[i] == order[i]) continue;
            if (fabsf(bs[g[i]] - bs[order[i]]) <= 1e-6f * fmaxf(1.0f, fabsf(bs[order[i]])))
                tied++;
            else
                wrong++;
        }
        for (int i = 0; i < K; i++)
            ref[(size_t)t * K + i] = g[i] >= 0 && g[i] < E ? sc[g[i]] / (sum + 1e-20f) * 1.5f : NAN;
    }
    relerr(r, wts, ref, (size_t)T * K);
    r->exact_ok = wrong == 0;
    snprintf(r->note, sizeof(r->note), "expert ids: %d wrong, %d swapped within rounding", wrong, tied);
    r->bytes = (double)T * E * 4;
    if (g_perf && cs->perf) r->ms = time_it(launch_route, &c);
    free(logits), free(bias), free(idx), free(wts), free(ref), free(sc), free(bs), free(order);
}

static void run_swiglu(const case_t *cs, result_t *r)
{
    int rows = cs->s[0], I = cs->s[1], weighted = cs->s[2];
    float *gu = frandv((size_t)rows * 2 * I, 20.0f), *wt = frandv((size_t)rows, 1.0f);
    size_t esz = cs->dt == BF16 ? 2 : 4, n = (size_t)rows * I;
    void *dh = dalloc(n * esz);
    poison(dh, n * esz);
    BT_OK_OR_DIE(bt_cuda_swiglu(dh, cs->dt, dup(gu, (size_t)rows * 2 * I * 4),
                                weighted ? dup(wt, (size_t)rows * 4) : NULL, rows, I, 10.0f, 0));
    float *y = get_act(dh, n, cs->dt), *ref = xmalloc(n * 4);
    for (int i = 0; i < rows; i++) /* model.c expert()'s activation */
        for (int j = 0; j < I; j++) {
            float g = gu[(size_t)i * 2 * I + j], u = gu[(size_t)i * 2 * I + I + j];
            u = fminf(fmaxf(u, -10.0f), 10.0f);
            g = fminf(g, 10.0f);
            float v = bt_siluf(g) * u;
            ref[(size_t)i * I + j] = weighted ? wt[i] * v : v;
        }
    relerr(r, y, ref, n);
    free(gu), free(wt), free(y), free(ref);
}

/* ---- engram ----------------------------------------------------------------------------- */

static void run_engram_gather(const case_t *cs, result_t *r)
{
    int T = cs->s[0], cols = cs->s[1], dim = cs->s[2], rows = cs->s[3];
    uint8_t *tab = xmalloc((size_t)rows * dim), *sc = xmalloc((size_t)rows * (dim / 32));
    for (size_t i = 0; i < (size_t)rows * dim; i++) tab[i] = rand_e4m3();
    for (size_t i = 0; i < (size_t)rows * (dim / 32); i++) sc[i] = (uint8_t)(118 + irand(16));
    int64_t *ids = xmalloc((size_t)T * cols * 8);
    for (size_t i = 0; i < (size_t)T * cols; i++) ids[i] = irand(rows);
    size_t n = (size_t)T * cols * dim, esz = cs->dt == BF16 ? 2 : 4;
    void *de = dalloc(n * esz);
    poison(de, n * esz);
    BT_OK_OR_DIE(bt_cuda_engram_gather(de, cs->dt, dup(ids, (size_t)T * cols * 8), T, cols,
                                       dup(tab, (size_t)rows * dim),
                                       dup(sc, (size_t)rows * (dim / 32)), rows, dim, 0));
    float *y = get_act(de, n, cs->dt), *ref = xmalloc(n * 4);
    for (size_t i = 0; i < (size_t)T * cols; i++)
        for (int d = 0; d < dim; d++)
            ref[i * dim + d] = bt_e4m3_to_f32(tab[(size_t)ids[i] * dim + d]) *
                               bt_e8m0_to_f32(sc[(size_t)ids[i] * (dim / 32) + d / 32]);
    relerr(r, y, ref, n);
    free(tab), free(sc), free(ids), free(y), free(ref);
}

static void run_engram_inject(const case_t *cs, result_t *r)
{
    int T = cs->s[0], hc = cs->s[1], D = cs->s[2];
    size_t nx = (size_t)T * hc * D;
    float *x = frandv(nx, 2.0f), *kv = frandv((size_t)T * (hc + 1) * D, 1.0f);
    float *qk = frandv((size_t)hc * D, 1.0f);
    float *dx = dup(x, nx * 4);
    BT_OK_OR_DIE(bt_cuda_engram_inject(dx, dup(kv, (size_t)T * (hc + 1) * D * 4),
                                       dup(qk, (size_t)hc * D * 4), T, hc, D, 1e-20f, 0));
    float *y = xmalloc(nx * 4);
    get(y, dx, nx * 4);
    for (int t = 0; t < T; t++) /* model.c engram_token's injection */
        for (int s = 0; s < hc; s++) {
            float *h = x + ((size_t)t * hc + s) * D;
            const float *key = kv + (size_t)t * (hc + 1) * D + (size_t)s * D;
            const float *val = kv + (size_t)t * (hc + 1) * D + (size_t)hc * D;
            float hh = 0.0f, kk = 0.0f, dot = 0.0f;
            for (int d = 0; d < D; d++) {
                hh += h[d] * h[d];
                kk += key[d] * key[d];
                dot += (h[d] * qk[(size_t)s * D + d]) * key[d];
            }
            float rstd = (1.0f / sqrtf(hh / (float)D + 1e-20f)) * (1.0f / sqrtf(kk / (float)D + 1e-20f));
            dot = dot * rstd * (1.0f / sqrtf((float)D));
            float g = sigm(copysignf(sqrtf(fmaxf(fabsf(dot), 1e-6f)), dot));
            for (int d = 0; d < D; d++) h[d] = h[d] + g * val[d];
        }
    relerr(r, y, x, nx);
    free(x), free(kv), free(qk), free(y);
}

/* ---- sampling --------------------------------------------------------------------------- */

/* The sampler's settings the cases run: each against services/engine/sampler.c on the same
 * rows and (seed, step) */
typedef struct {
    float temperature, top_p, min_p;
    int top_k, want_logprob, n_top;
} sample_setting_t;

static const sample_setting_t sample_settings[] = {
    {0.0f, 1.0f, 0.0f, 0, 0, 0},        /* greedy */
    {0.0f, 1.0f, 0.0f, 0, 1, 20},       /* greedy with logprobs and the top 20 */
    {1.0f, 1.0f, 0.0f, 0, 1, 0},        /* the API's default */
    {0.7f, 0.9f, 0.0f, 0, 0, 0},        /* top_p */
    {0.7f, 1.0f, 0.0f, 50, 0, 0},       /* top_k */
    {1.0f, 1.0f, 0.05f, 0, 0, 0},       /* min_p */
    {0.8f, 0.95f, 0.02f, 40, 1, 5},     /* all three, logprobs */
    {1.0f, 1.0f, 0.0f, 1, 0, 3},        /* top_k 1 */
    {1.0f, 0.01f, 0.0f, 0, 0, 0},       /* a nucleus of one or two */
    {1e-39f, 1.0f, 0.0f, 0, 1, 0},      /* 1 / temperature overflows: the argmax */
    {1.3f, 0.5f, 0.0f, 0, 0, 1},        /* a wide nucleus */
    {1.0f, 1.0f, 0.0f, -2, 0, 0},       /* top_k V - 1 (-2: V + top_k + 1) */
    {2.0f, 1.0f, 2.0f, 0, 0, 0},        /* min_p over 1: the best */
    {1.0f, 0.6f, 0.3f, 7, 1, 20},       /* min_p and top_p inside a top_k */
};
enum { N_SAMPLE_SETTINGS = (int)(sizeof sample_settings / sizeof sample_settings[0]) };

typedef struct {
    bt_cuda_sample_result_t *out;
    bt_cuda_sample_params_t *params;
    float *logits;
    int T, V;
    int64_t ld;
    /* the way the workers drew before: the rows to pageable host memory, the host sampler */
    const bt_cuda_sample_params_t *params_h;
    float *rows_h;
    bt_sampler_t *sampler;
} sample_ctx_t;

static void launch_sample(void *p)
{
    sample_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_sample_rows(c->out, c->params, c->logits, c->ld, c->T, c->V, 0));
}

static void host_sample(void *p)
{
    sample_ctx_t *c = p;
    CUDA_OK(cudaMemcpy(c->rows_h, c->logits, (size_t)c->T * c->ld * 4, cudaMemcpyDeviceToHost));
    for (int t = 0; t < c->T; t++) {
        const bt_cuda_sample_params_t *q = &c->params_h[t];
        bt_sampling_t sp = {q->temperature, q->top_p, q->min_p, q->top_k, q->seed};
        float lp;
        bt_top_logprob_t top[BT_CUDA_SAMPLE_TOP];
        bt_sampler_sample(c->sampler, &sp, c->rows_h + (size_t)t * c->ld, q->step, &lp, top,
                          q->n_top < c->V ? q->n_top : c->V);
    }
}

/* s: T V setting (-1: row t takes setting t mod the table's size) shape (0: logits uniform in
 * +-8; 1: the same with ties planted at the maximum and among the best; 2: flat, +-0.5; 3: half
 * of the ids -inf, a few huge negatives; 4: NaN at id 0 in every other row and at ~1% of the
 * ids: ranked below everything, never drawn, as sampler.c does) ld-pad */
static void run_sample(const case_t *cs, result_t *r)
{
    const int T = cs->s[0], V = cs->s[1], which = cs->s[2], shape = cs->s[3];
    const int64_t ld = V + cs->s[4];
    float *l = frandv((size_t)T * ld, shape == 2 ? 0.5f : 8.0f);
    bt_cuda_sample_params_t *p = xmalloc((size_t)T * sizeof *p);
    for (int t = 0; t < T; t++) {
        float *row = l + (size_t)t * ld;
        if (shape == 1) { /* the maximum three times; runs of equal logits near the top */
            row[V / 2] = row[V / 3] = row[V - 1] = 9.0f;
            for (int j = 0; j < 40 && j < V; j++) row[irand(V)] = 7.5f;
        } else if (shape == 3) {
            for (int j = 0; j < V; j++)
                if (irand(2)) row[j] = j % 7 ? -INFINITY : -1e30f;
            row[irand(V)] = 3.0f;
        } else if (shape == 4) { /* a broken row: NaN first (every other row) and here and there */
            if (t % 2 == 0) row[0] = NAN;
            for (int j = 0; j < 1 + V / 100; j++) row[irand(V)] = NAN;
        }
        const sample_setting_t *st = &sample_settings[which >= 0 ? which : t % N_SAMPLE_SETTINGS];
        p[t] = (bt_cuda_sample_params_t){.temperature = st->temperature, .top_p = st->top_p,
                                         .min_p = st->min_p, .top_k = st->top_k < -1 ? V + st->top_k + 1 : st->top_k,
                                         .seed = rnd(), .step = (uint64_t)irand(1000),
                                         .want_logprob = st->want_logprob, .n_top = st->n_top};
    }
    sample_ctx_t c = {0};
    c.T = T, c.V = V, c.ld = ld;
    c.logits = dup(l, (size_t)T * ld * 4);
    c.params = dup(p, (size_t)T * sizeof *p);
    c.out = dalloc((size_t)T * sizeof *c.out);
    poison_int(c.out, (size_t)T * sizeof *c.out);
    launch_sample(&c);
    bt_cuda_sample_result_t *out = xmalloc((size_t)T * sizeof *out);
    get(out, c.out, (size_t)T * sizeof *out);
    bt_sampler_t *ref = bt_sampler_create(V);
    int wrong = 0;
    double lp_err = 0.0;
    for (int t = 0; t < T; t++) {
        const bt_cuda_sample_params_t *q = &p[t];
        bt_sampling_t sp = {q->temperature, q->top_p, q->min_p, q->top_k, q->seed};
        float lp = 0.0f;
        bt_top_logprob_t top[BT_CUDA_SAMPLE_TOP];
        const int n_top = q->n_top < V ? q->n_top : V;
        const int32_t want = bt_sampler_sample(ref, &sp, l + (size_t)t * ld, q->step, &lp, top, n_top);
        int bad = out[t].id != want;
        if (q->want_logprob) {
            double e = fabs((double)out[t].logprob - (double)lp) / fmax(1.0, fabs((double)lp));
            lp_err = fmax(lp_err, isfinite(out[t].logprob) == isfinite(lp) ? (isfinite(lp) ? e : 0.0) : INFINITY);
        }
        for (int k = 0; k < BT_CUDA_SAMPLE_TOP; k++) {
            if (k >= n_top) { /* past the asked: -1 */
                bad |= out[t].top_id[k] != -1;
                continue;
            }
            bad |= out[t].top_id[k] != top[k].id;
            double e = fabs((double)out[t].top_logprob[k] - (double)top[k].logprob) / fmax(1.0, fabs((double)top[k].logprob));
            lp_err = fmax(lp_err, isfinite(top[k].logprob) ? e : (out[t].top_logprob[k] == top[k].logprob ? 0.0 : INFINITY));
        }
        if (bad && wrong == 0)
            fprintf(stderr, "sample row %d (setting t=%g p=%g min_p=%g k=%d): gpu %d, cpu %d\n", t,
                    q->temperature, q->top_p, q->min_p, q->top_k, out[t].id, want);
        wrong += bad;
    }
    bt_sampler_destroy(ref);
    /* Same weights bit for bit and the same kept sets: every token and top list equal. The
     * log-probabilities sum the row in another order (double): 1e-6 relative. */
    r->bound = 1e-6;
    r->err = lp_err;
    r->exact_ok = wrong == 0;
    snprintf(r->note, sizeof(r->note), "%d of %d rows differ from sampler.c", wrong, T);
    r->bytes = (double)T * V * 4;
    if (g_perf && cs->perf) {
        r->ms = time_it(launch_sample, &c);
        c.params_h = p;
        c.rows_h = xmalloc((size_t)T * ld * 4);
        c.sampler = bt_sampler_create(V);
        float host_ms = time_it(host_sample, &c);
        snprintf(r->note, sizeof(r->note), "%d of %d rows differ; rows to host + sampler.c %.3f ms", wrong, T, host_ms);
        bt_sampler_destroy(c.sampler);
        free(c.rows_h);
    }
    free(l), free(p), free(out);
}

/* ---- the device model's glue (kernels/cuda/engine_ops.cu) -------------------------------- */

static void run_gemm_f32(const case_t *cs, result_t *r)
{
    int M = cs->s[0], N = cs->s[1], K = cs->s[2], ldx = K + cs->s[3], ldy = N + cs->s[4];
    float *x = frandv((size_t)M * ldx, 1.0f), *w = frandv((size_t)N * K, 1.0f);
    float *dy = dalloc((size_t)M * ldy * 4);
    poison(dy, (size_t)M * ldy * 4);
    BT_OK_OR_DIE(bt_cuda_gemm_f32(g_blas, dy, ldy, dup(x, (size_t)M * ldx * 4), ldx,
                                  dup(w, (size_t)N * K * 4), M, N, K, 0));
    float *y = xmalloc((size_t)M * ldy * 4), *out = xmalloc((size_t)M * N * 4), *ref = xmalloc((size_t)M * N * 4);
    get(y, dy, (size_t)M * ldy * 4);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++) acc += (double)x[(size_t)m * ldx + k] * w[(size_t)n * K + k];
            ref[(size_t)m * N + n] = (float)acc;
            out[(size_t)m * N + n] = y[(size_t)m * ldy + n];
        }
    relerr(r, out, ref, (size_t)M * N);
    r->flops = 2.0 * M * N * K;
    free(x), free(w), free(y), free(out), free(ref);
}

static void run_embed(const case_t *cs, result_t *r)
{
    int T = cs->s[0], hc = cs->s[1], D = cs->s[2], V = cs->s[3];
    float *tab = frandv((size_t)V * D, 1.0f);
    int32_t *ids = xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) ids[t] = irand(V);
    size_t nx = (size_t)T * hc * D;
    float *dx = dalloc(nx * 4), *dpre = dalloc((size_t)T * hc * 4);
    poison(dx, nx * 4), poison(dpre, (size_t)T * hc * 4);
    BT_OK_OR_DIE(bt_cuda_embed_streams(dx, dpre, dup(tab, (size_t)V * D * 4), dup(ids, (size_t)T * 4), T, hc, D, 0));
    float *x = xmalloc(nx * 4), *pre = xmalloc((size_t)T * hc * 4), *ref = xmalloc(nx * 4);
    get(x, dx, nx * 4), get(pre, dpre, (size_t)T * hc * 4);
    for (int t = 0; t < T; t++) /* model.c: the row into every stream, stream 0 collapses first */
        for (int k = 0; k < hc; k++) {
            memcpy(ref + ((size_t)t * hc + k) * D, tab + (size_t)ids[t] * D, (size_t)D * 4);
            if (pre[(size_t)t * hc + k] != (k == 0 ? 1.0f : 0.0f)) r->exact_ok = 0;
        }
    relerr(r, x, ref, nx);
    if (memcmp(x, ref, nx * 4)) r->exact_ok = 0; /* a copy: bit-exact */
    free(tab), free(ids), free(x), free(pre), free(ref);
}

static void run_gather(const case_t *cs, result_t *r)
{
    int n = cs->s[0], width = cs->s[1], rows = cs->s[2];
    float *src = frandv((size_t)rows * width, 1.0f);
    int64_t *idx = xmalloc((size_t)n * 8);
    for (int i = 0; i < n; i++) idx[i] = irand(rows);
    float *dd = dalloc((size_t)n * width * 4);
    poison(dd, (size_t)n * width * 4);
    BT_OK_OR_DIE(bt_cuda_gather_rows(dd, dup(src, (size_t)rows * width * 4), dup(idx, (size_t)n * 8), n, width, 0));
    float *y = xmalloc((size_t)n * width * 4);
    get(y, dd, (size_t)n * width * 4);
    for (int i = 0; i < n; i++)
        if (memcmp(y + (size_t)i * width, src + (size_t)idx[i] * width, (size_t)width * 4)) r->exact_ok = 0;
    snprintf(r->note, sizeof r->note, "bit-exact copy");
    free(src), free(idx), free(y);
}

static void run_scatter(const case_t *cs, result_t *r)
{
    int n = cs->s[0], width = cs->s[1], rows = cs->s[2];
    size_t total = (size_t)rows * width;
    float *src = frandv((size_t)n * width, 1.0f), *before = frandv(total, 1.0f);
    int64_t *off = xmalloc((size_t)n * 8);
    for (int i = 0; i < n; i++) /* distinct rows, at element offsets that are not row multiples */
        off[i] = (int64_t)(i * (rows / n)) * width + (i % 3);
    float *dd = dup(before, total * 4);
    BT_OK_OR_DIE(bt_cuda_scatter_rows(dd, dup(off, (size_t)n * 8), dup(src, (size_t)n * width * 4), n, width, 0));
    float *y = xmalloc(total * 4);
    get(y, dd, total * 4);
    for (int i = 0; i < n; i++) memcpy(before + off[i], src + (size_t)i * width, (size_t)width * 4);
    if (memcmp(y, before, total * 4)) r->exact_ok = 0; /* the rows written, nothing else */
    snprintf(r->note, sizeof r->note, "bit-exact, the rest untouched");
    free(src), free(before), free(off), free(y);
}

static void run_copy_ranges(const case_t *cs, result_t *r)
{
    const int n = cs->s[0], max_len = cs->s[1];
    const size_t src_bytes = (size_t)cs->s[2];
    uint8_t *src = xmalloc(src_bytes);
    for (size_t i = 0; i < src_bytes; i++) src[i] = (uint8_t)rnd();
    uint8_t *dsrc = dup(src, src_bytes);
    size_t *soff = xmalloc((size_t)n * sizeof *soff), *doff = xmalloc((size_t)n * sizeof *doff);
    size_t *len = xmalloc((size_t)n * sizeof *len), total = 0;
    for (int i = 0; i < n; i++) {
        /* every third copy 16-byte aligned, every third 4-byte (as KV rows are), the rest odd */
        const size_t unit = i % 3 == 0 ? 16 : i % 3 == 1 ? 4 : 1;
        len[i] = (size_t)irand(max_len / (int)unit + 1) * unit;
        if (i == 1) len[i] = 0;
        /* longer than a block's 256 threads take in one round, in each unit */
        if (i >= 2 && i <= 4) len[i] = (size_t)max_len * 3 / unit * unit + (unit == 1);
        soff[i] = (size_t)irand((int)((src_bytes - len[i]) / unit)) * unit;
        /* destinations one after another, each as aligned as its source */
        total = (total + unit - 1) / unit * unit;
        doff[i] = total;
        total += len[i] + (i % 5 == 4 ? 8 : 0); /* and some gaps */
    }
    const size_t cap = total + 64;
    uint8_t *dd = dalloc(cap), *y = xmalloc(cap), *want = xmalloc(cap);
    bt_cuda_copy_t *cp = xmalloc((size_t)n * sizeof *cp);
    for (int i = 0; i < n; i++) cp[i] = (bt_cuda_copy_t){dsrc + soff[i], dd + doff[i], len[i]};
    poison(dd, cap);
    get(want, dd, cap); /* the poison, where no copy lands */
    for (int i = 0; i < n; i++) memcpy(want + doff[i], src + soff[i], len[i]);
    BT_OK_OR_DIE(bt_cuda_copy_ranges(dup(cp, (size_t)n * sizeof *cp), n, 0));
    get(y, dd, cap);
    if (memcmp(y, want, cap)) r->exact_ok = 0; /* the copies made, the gaps untouched */
    snprintf(r->note, sizeof r->note, "bit-exact, %zu bytes in %d copies, gaps untouched", total, n);
    free(src), free(soff), free(doff), free(len), free(cp), free(y), free(want);
}

/* logits[row * ld + id] -= amount: bit for bit the host's float subtraction, every other
 * element (the padding past V included) untouched */
static void run_logit_adjust(const case_t *cs, result_t *r)
{
    const int T = cs->s[0], V = cs->s[1], ld = V + cs->s[2], n = cs->s[3];
    const size_t all = (size_t)T * ld;
    float *l = frandv(all, 8.0f), *want = xmalloc(all * 4), *y = xmalloc(all * 4);
    memcpy(want, l, all * 4);
    bt_cuda_logit_adjust_t *adj = xmalloc((size_t)n * sizeof *adj);
    uint8_t *hit = calloc(all, 1);
    for (int i = 0; i < n; i++) { /* distinct pairs; amounts of both signs, some large */
        int row, id;
        do {
            row = irand(T);
            id = irand(V);
        } while (hit[(size_t)row * ld + id]);
        hit[(size_t)row * ld + id] = 1;
        const float amount = i % 4 == 3 ? -100.0f : frand() * (i % 2 ? 2.0f : 0.3f);
        adj[i] = (bt_cuda_logit_adjust_t){row, id, amount};
        want[(size_t)row * ld + id] -= amount;
    }
    float *dl = dup(l, all * 4);
    BT_OK_OR_DIE(bt_cuda_logit_adjust(dl, ld, dup(adj, (size_t)n * sizeof *adj), n, 0));
    get(y, dl, all * 4);
    relerr(r, y, want, all);
    if (memcmp(y, want, all * 4)) r->exact_ok = 0;
    snprintf(r->note, sizeof r->note, "bit-exact, %d of %zu logits adjusted, the rest untouched", n, all);
    free(l), free(want), free(y), free(adj), free(hit);
}

/* Constrained decoding's masks: -inf where a row's bit is 0 (rows dense, sparse, all allowed,
 * none allowed), every other element, the padding past V included, untouched */
static void run_logit_mask(const case_t *cs, result_t *r)
{
    const int T = cs->s[0], V = cs->s[1], ld = V + cs->s[2], words = (V + 31) / 32 + cs->s[3];
    const size_t all = (size_t)T * ld;
    float *l = frandv(all, 8.0f), *want = xmalloc(all * 4), *y = xmalloc(all * 4);
    memcpy(want, l, all * 4);
    uint32_t *mask = xmalloc((size_t)T * words * 4);
    int masked = 0;
    for (int t = 0; t < T; t++)
        for (int w = 0; w < words; w++) {
            const int kind = t % 4; /* 0 random, 1 sparse, 2 all, 3 none */
            uint32_t bits = kind == 0 ? (uint32_t)irand(1 << 16) << 16 | (uint32_t)irand(1 << 16)
                            : kind == 1 ? (irand(8) == 0 ? 1u << irand(32) : 0u)
                            : kind == 2 ? 0xffffffffu : 0u;
            mask[(size_t)t * words + w] = bits;
            for (int b = 0; b < 32; b++) {
                const int id = w * 32 + b;
                if (id < V && !((bits >> b) & 1u)) {
                    want[(size_t)t * ld + id] = -INFINITY;
                    masked++;
                }
            }
        }
    float *dl = dup(l, all * 4);
    BT_OK_OR_DIE(bt_cuda_logit_mask(dl, ld, dup(mask, (size_t)T * words * 4), words, T, V, 0));
    get(y, dl, all * 4);
    r->exact_ok = !memcmp(y, want, all * 4);
    r->err = r->exact_ok ? 0.0 : 1.0;
    snprintf(r->note, sizeof r->note, "bit-exact, %d of %zu logits masked, the rest untouched",
             masked, all);
    free(l), free(want), free(y), free(mask);
}

static void run_scale(const case_t *cs, result_t *r)
{
    size_t n = (size_t)cs->s[0];
    float *x = frandv(n, 3.0f), *dx = dup(x, n * 4), *y = xmalloc(n * 4);
    BT_OK_OR_DIE(bt_cuda_scale(dx, n, 0.353553f, 0));
    get(y, dx, n * 4);
    for (size_t i = 0; i < n; i++) x[i] *= 0.353553f;
    relerr(r, y, x, n);
    if (memcmp(x, y, n * 4)) r->exact_ok = 0;
    free(x), free(y);
}

static void run_moe_combine(const case_t *cs, result_t *r)
{
    int T = cs->s[0], D = cs->s[1], K = cs->s[2], shared = cs->s[3], total = T * K;
    float *y = frandv((size_t)total * D, 1.0f), *sh = frandv((size_t)T * D, 1.0f);
    int32_t *rows = xmalloc((size_t)T * K * 4), *cnt = xmalloc((size_t)T * 4);
    /* a permutation of the rows dealt out, some tokens short of K (a routed expert repeated
     * elsewhere would be a bug upstream; here the lists are simply shorter) */
    int32_t *perm = xmalloc((size_t)total * 4);
    for (int i = 0; i < total; i++) perm[i] = i;
    for (int i = total - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int t = 0; t < T; t++) {
        cnt[t] = K - irand(2);
        for (int j = 0; j < K; j++) rows[t * K + j] = perm[t * K + j];
    }
    float *dout = dalloc((size_t)T * D * 4);
    poison(dout, (size_t)T * D * 4);
    BT_OK_OR_DIE(bt_cuda_moe_combine(dout, dup(y, (size_t)total * D * 4), dup(rows, (size_t)T * K * 4),
                                     dup(cnt, (size_t)T * 4), K, shared ? dup(sh, (size_t)T * D * 4) : NULL, T, D, 0));
    float *out = xmalloc((size_t)T * D * 4), *ref = xmalloc((size_t)T * D * 4);
    get(out, dout, (size_t)T * D * 4);
    for (int t = 0; t < T; t++) /* model.c moe_token: routed in order, then the shared expert */
        for (int d = 0; d < D; d++) {
            float acc = 0.0f;
            for (int j = 0; j < cnt[t]; j++) acc += y[(size_t)rows[t * K + j] * D + d];
            ref[(size_t)t * D + d] = shared ? acc + sh[(size_t)t * D + d] : acc;
        }
    relerr(r, out, ref, (size_t)T * D);
    if (memcmp(out, ref, (size_t)T * D * 4)) r->exact_ok = 0; /* same order of additions */
    free(y), free(sh), free(rows), free(cnt), free(perm), free(out), free(ref);
}

static void run_compress(const case_t *cs, result_t *r)
{
    int G = cs->s[0], R = cs->s[1], dim = cs->s[2];
    size_t n = (size_t)G * R * dim;
    float *kv = frandv(n, 2.0f), *gate = frandv(n, 4.0f);
    float *dl = dalloc((size_t)G * dim * 4);
    poison(dl, (size_t)G * dim * 4);
    BT_OK_OR_DIE(bt_cuda_compress_pool(dl, dup(kv, n * 4), R > 1 ? dup(gate, n * 4) : NULL, G, R, dim, 0));
    float *out = xmalloc((size_t)G * dim * 4), *ref = xmalloc((size_t)G * dim * 4);
    get(out, dl, (size_t)G * dim * 4);
    for (int g = 0; g < G; g++) /* model.c compress_seq */
        for (int d = 0; d < dim; d++) {
            const float *k = kv + (size_t)g * R * dim, *gt = gate + (size_t)g * R * dim;
            if (R == 1) {
                ref[(size_t)g * dim + d] = k[d];
                continue;
            }
            float mx = -INFINITY, ex[16], sum = 0.0f, acc = 0.0f;
            for (int j = 0; j < R; j++) mx = fmaxf(mx, gt[(size_t)j * dim + d]);
            for (int j = 0; j < R; j++) sum += ex[j] = expf(gt[(size_t)j * dim + d] - mx);
            for (int j = 0; j < R; j++) acc += k[(size_t)j * dim + d] * (ex[j] / sum);
            ref[(size_t)g * dim + d] = acc;
        }
    relerr(r, out, ref, (size_t)G * dim);
    free(kv), free(gate), free(out), free(ref);
}

static void run_block_max(const case_t *cs, result_t *r)
{
    int T = cs->s[0], n = cs->s[1], bs = cs->s[2], nb = (n + bs - 1) / bs;
    float *sc = frandv((size_t)T * n, 5.0f);
    int64_t *vis = xmalloc((size_t)T * 8);
    for (int t = 0; t < T; t++) {
        vis[t] = t == 0 ? 0 : 1 + irand(n);
        for (int j = (int)vis[t]; j < n; j++) sc[(size_t)t * n + j] = -INFINITY; /* as scored */
    }
    float *db = dalloc((size_t)T * nb * 4);
    poison(db, (size_t)T * nb * 4);
    BT_OK_OR_DIE(bt_cuda_block_max(db, dup(sc, (size_t)T * n * 4), dup(vis, (size_t)T * 8), T, n, bs, nb, 0));
    float *out = xmalloc((size_t)T * nb * 4);
    get(out, db, (size_t)T * nb * 4);
    for (int t = 0; t < T; t++) /* model.c index_token, level one */
        for (int b = 0; b < nb; b++) {
            float mx = -INFINITY;
            for (int j = b * bs; j < (b + 1) * bs && j < n; j++) mx = fmaxf(mx, sc[(size_t)t * n + j]);
            if (vis[t] > 0 && (vis[t] - 1) / bs == b) mx = INFINITY;
            if (memcmp(&mx, &out[(size_t)t * nb + b], 4)) r->exact_ok = 0;
        }
    snprintf(r->note, sizeof r->note, "exact, pinned newest block, -inf tails");
    free(sc), free(vis), free(out);
}

static void run_mask_blocks(const case_t *cs, result_t *r)
{
    int T = cs->s[0], n = cs->s[1], bs = cs->s[2], kept = cs->s[3], nb = (n + bs - 1) / bs, stride = kept + 1;
    float *sc = frandv((size_t)T * n, 5.0f);
    int32_t *cand = xmalloc((size_t)T * stride * 4), *cn = xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) { /* ascending distinct blocks */
        int c = 0;
        for (int b = 0; b < nb && c < kept; b++)
            if (irand(nb) < kept) cand[t * stride + c++] = b;
        cn[t] = c;
    }
    float *ds = dup(sc, (size_t)T * n * 4), *out = xmalloc((size_t)T * n * 4);
    BT_OK_OR_DIE(bt_cuda_mask_blocks(ds, dup(cand, (size_t)T * stride * 4), dup(cn, (size_t)T * 4), stride, T, n, bs, 0));
    get(out, ds, (size_t)T * n * 4);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < n; j++) {
            int in = 0;
            for (int c = 0; c < cn[t]; c++) in |= cand[t * stride + c] == j / bs;
            float want = in ? sc[(size_t)t * n + j] : -INFINITY;
            if (memcmp(&want, &out[(size_t)t * n + j], 4)) r->exact_ok = 0;
        }
    snprintf(r->note, sizeof r->note, "exact");
    free(sc), free(cand), free(cn), free(out);
}

static void run_trim_sel(const case_t *cs, result_t *r)
{
    int T = cs->s[0], stride = cs->s[1];
    int32_t *sel = xmalloc((size_t)T * stride * 4), *nin = xmalloc((size_t)T * 4), *nout = xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) {
        nin[t] = irand(stride + 1);
        for (int j = 0; j < stride; j++) sel[t * stride + j] = j < nin[t] ? 3 * j + irand(3) : -1;
    }
    int64_t limit = 2 * stride;
    int32_t *dn = dalloc((size_t)T * 4);
    poison_int(dn, (size_t)T * 4);
    BT_OK_OR_DIE(bt_cuda_trim_sel(dn, dup(sel, (size_t)T * stride * 4), dup(nin, (size_t)T * 4), stride, T, limit, 0));
    get(nout, dn, (size_t)T * 4);
    for (int t = 0; t < T; t++) { /* model.c attend_token's trim */
        int k = nin[t];
        while (k > 0 && sel[t * stride + k - 1] >= limit) k--;
        if (nout[t] != k) r->exact_ok = 0;
    }
    snprintf(r->note, sizeof r->note, "exact");
    free(sel), free(nin), free(nout);
}

static void run_moe_group(const case_t *cs, result_t *r)
{
    int N = cs->s[0], K = cs->s[1], E = cs->s[2], bad = cs->s[3], total = N * K;
    int slots = E < total ? E : total;
    int32_t *idx = xmalloc((size_t)total * 4);
    float *wts = frandv((size_t)total, 1.0f);
    for (int t = 0; t < N; t++) /* each token picks K distinct experts, in no particular order */
        for (int i = 0; i < K; i++) {
            int e, dupl;
            do {
                e = irand(E);
                dupl = 0;
                for (int j = 0; j < i; j++) dupl |= idx[t * K + j] == e;
            } while (dupl && K <= E);
            idx[t * K + i] = e;
        }
    if (bad) idx[total / 2] = E + 3;
    /* the reference: model_cuda.c moe()'s host grouping (a counting sort, items dropped where
     * the id is out of range) */
    int32_t *offs = calloc((size_t)E + 1, 4), *fill = xmalloc((size_t)E * 4), *xrow = xmalloc((size_t)total * 4);
    int32_t *rows = xmalloc((size_t)total * 4), *cnt = calloc((size_t)N, 4), *hit = xmalloc((size_t)slots * 4);
    float *wt = xmalloc((size_t)total * 4);
    for (int j = 0; j < total; j++)
        if (idx[j] >= 0 && idx[j] < E) offs[idx[j] + 1]++;
    for (int e = 0; e < E; e++) offs[e + 1] += offs[e];
    memcpy(fill, offs, (size_t)E * 4);
    for (int j = 0; j < total; j++) {
        if (idx[j] < 0 || idx[j] >= E) continue;
        int p = fill[idx[j]]++;
        xrow[p] = j / K;
        wt[p] = wts[j];
    }
    for (int p = 0; p < offs[E]; p++) rows[xrow[p] * K + cnt[xrow[p]]++] = p;
    int n_hit = 0;
    for (int e = 0; e < E; e++)
        if (offs[e + 1] > offs[e]) hit[n_hit++] = e;
    for (int i = n_hit; i < slots; i++) hit[i] = -1;

    int32_t *d_offs = dalloc(((size_t)E + 1) * 4), *d_xrow = dalloc((size_t)total * 4), *d_rows = dalloc((size_t)total * 4);
    int32_t *d_cnt = dalloc((size_t)N * 4), *d_hit = dalloc((size_t)slots * 4), *d_bad = dalloc(4);
    float *d_wt = dalloc((size_t)total * 4);
    poison_int(d_offs, ((size_t)E + 1) * 4), poison_int(d_xrow, (size_t)total * 4), poison_int(d_rows, (size_t)total * 4);
    poison_int(d_cnt, (size_t)N * 4), poison_int(d_hit, (size_t)slots * 4), poison(d_wt, (size_t)total * 4);
    CUDA_OK(cudaMemset(d_bad, 0, 4));
    BT_OK_OR_DIE(bt_cuda_moe_group(d_offs, d_xrow, d_wt, d_rows, d_cnt, d_hit, slots, d_bad, 42,
                                   dup(idx, (size_t)total * 4), dup(wts, (size_t)total * 4), N, K, E, 0));
    int32_t *g_offs = xmalloc(((size_t)E + 1) * 4), *g_xrow = xmalloc((size_t)total * 4), *g_rows = xmalloc((size_t)total * 4);
    int32_t *g_cnt = xmalloc((size_t)N * 4), *g_hit = xmalloc((size_t)slots * 4), g_bad = 0;
    float *g_wt = xmalloc((size_t)total * 4);
    get(g_offs, d_offs, ((size_t)E + 1) * 4), get(g_xrow, d_xrow, (size_t)total * 4), get(g_cnt, d_cnt, (size_t)N * 4);
    get(g_hit, d_hit, (size_t)slots * 4), get(g_wt, d_wt, (size_t)total * 4), get(&g_bad, d_bad, 4);
    get(g_rows, d_rows, (size_t)total * 4);
    int placed = offs[E], wrong = 0;
    wrong += memcmp(g_offs, offs, ((size_t)E + 1) * 4) != 0;
    wrong += memcmp(g_xrow, xrow, (size_t)placed * 4) != 0;
    wrong += memcmp(g_wt, wt, (size_t)placed * 4) != 0;
    wrong += memcmp(g_cnt, cnt, (size_t)N * 4) != 0;
    wrong += memcmp(g_hit, hit, (size_t)slots * 4) != 0;
    for (int t = 0; t < N; t++) wrong += memcmp(g_rows + t * K, rows + t * K, (size_t)cnt[t] * 4) != 0;
    wrong += g_bad != (bad ? 42 : 0);
    r->exact_ok = wrong == 0;
    snprintf(r->note, sizeof r->note, "exact: %d of 7 outputs differ; %d experts hit", wrong, n_hit);
    free(idx), free(wts), free(offs), free(fill), free(xrow), free(rows), free(cnt), free(hit), free(wt);
    free(g_offs), free(g_xrow), free(g_rows), free(g_cnt), free(g_hit), free(g_wt);
}

/* s = E N K R T limit cap: the experts' w13 with their SwiGLU in one launch (h [R, N/2], each
 * row its own routing weight) against the grouped product's f32 sums and bt_cuda_swiglu, bit
 * for bit; K and the list as run_gemm_fp4's (OP_GEMM_FP4_LIST), an expert at most cap rows (0:
 * 16, a decode step's form; more: a prefill's, on Hopper only) */
static void run_fp4_swiglu(const case_t *cs, result_t *r)
{
    int E = cs->s[0], N = cs->s[1], K = cs->s[2], R = cs->s[3], T = cs->s[4], I = N / 2;
    int cap = cs->s[6] ? cs->s[6] : 16;
    float limit = (float)cs->s[5];
    float *x = frandv((size_t)T * K, 1.0f), *wt = frandv((size_t)R, 1.0f);
    size_t wbytes = (size_t)E * N * (K / 2), sbytes = (size_t)E * N * (K / 32);
    uint8_t *w = xmalloc(wbytes), *s = xmalloc(sbytes);
    for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)rnd();
    for (size_t i = 0; i < sbytes; i++) s[i] = (uint8_t)(122 + irand(8));
    int32_t *offs = xmalloc((size_t)(E + 1) * 4), *rows = xmalloc((size_t)R * 4), *el = xmalloc((size_t)(E + 3) * 4);
    int max_rows = 0, at = 0, nl = 0, *cnt = calloc((size_t)E, sizeof(int));
    for (int i = 0; i < R; i++) { /* each row a random expert of fewer than cap so far */
        int e;
        do e = irand(E);
        while (cnt[e] >= cap);
        cnt[e]++;
    }
    for (int e = 0; e < E; e++) {
        offs[e] = at;
        for (int i = 0; i < cnt[e]; i++) rows[at++] = irand(T);
        if (cnt[e] > max_rows) max_rows = cnt[e];
        if (cnt[e] > 0) el[nl++] = e;
    }
    offs[E] = at;
    free(cnt);
    for (int k = 0; k < 3; k++) el[nl + k] = -1; /* padded, as bt_cuda_moe_group leaves it */
    if (!bt_cuda_gemm_fp4_swiglu_fits(I, K, max_rows)) {
        /* (a prefill's form needs gemm_fp4_wgrs: Hopper, and neither switched off) */
        const char *wgrs = getenv("BT_CUDA_WGRS"), *wsw = getenv("BT_CUDA_WGRS_SWIGLU");
        r->exact_ok = max_rows > 16 && (g_sm_major != 9 || (wgrs && strcmp(wgrs, "0") == 0) ||
                                        (wsw && strcmp(wsw, "0") == 0));
        snprintf(r->note, sizeof r->note, "the shape is not taken (bt_cuda_gemm_fp4_swiglu_fits)%s",
                 r->exact_ok ? ": no gemm_fp4_wgrs here" : "");
        free(x), free(wt), free(w), free(s), free(offs), free(rows), free(el);
        return;
    }
    const uint16_t *dx = dup_bf16(x, (size_t)T * K);
    uint8_t *dw = dup(w, wbytes);
    BT_OK_OR_DIE(bt_cuda_fp4_to_frag(dw, wbytes, 0));
    const uint8_t *ds = dup(s, sbytes);
    const int32_t *drows = dup(rows, (size_t)R * 4), *doffs = dup(offs, (size_t)(E + 1) * 4);
    const int32_t *del = dup(el, (size_t)(nl + 3) * 4);
    const float *dwt = dup(wt, (size_t)R * 4);
    size_t esz = cs->dt == BF16 ? 2 : 4, hsz = (size_t)R * I * esz;
    float *gu = dalloc((size_t)R * N * 4);
    void *h0 = dalloc(hsz), *h1 = dalloc(hsz);
    poison(gu, (size_t)R * N * 4), poison(h0, hsz), poison(h1, hsz);
    BT_OK_OR_DIE(bt_cuda_gemm_fp4_grouped_list(gu, F32, dx, drows, doffs, del, nl + 3, max_rows, dw, ds, N, K, 0));
    BT_OK_OR_DIE(bt_cuda_swiglu(h0, cs->dt, gu, dwt, R, I, limit, 0));
    BT_OK_OR_DIE(bt_cuda_gemm_fp4_swiglu_list(h1, cs->dt, dx, drows, doffs, del, nl + 3, max_rows, dw, ds, I, K,
                                              dwt, limit, 0));
    char *a = xmalloc(hsz), *b = xmalloc(hsz);
    get(a, h0, hsz), get(b, h1, hsz);
    r->exact_ok = at == R && memcmp(a, b, hsz) == 0;
    float *hv = get_act(h1, (size_t)R * I, cs->dt);
    for (size_t i = 0; i < (size_t)R * I; i++)
        if (!isfinite(hv[i])) r->finite = 0;
    snprintf(r->note, sizeof r->note, "exact: %s; %d experts listed, at most %d rows", r->exact_ok ? "same bits" : "DIFFER", nl, max_rows);
    free(x), free(wt), free(w), free(s), free(offs), free(rows), free(el), free(a), free(b), free(hv);
}

/* s = T hc D K shared: the MoE's combine summed in the expand against bt_cuda_moe_combine then
 * bt_cuda_hc_expand, bit for bit (each token up to K of the T * K routed rows, in any order) */
static void run_expand_moe(const case_t *cs, result_t *r)
{
    int T = cs->s[0], hc = cs->s[1], D = cs->s[2], K = cs->s[3], total = T * K;
    float *y = frandv((size_t)total * D, 1.0f), *sh = cs->s[4] ? frandv((size_t)T * D, 1.0f) : NULL;
    float *x = frandv((size_t)T * hc * D, 1.0f), *post = frandv((size_t)T * hc, 1.0f);
    float *comb = frandv((size_t)T * hc * hc, 1.0f);
    int32_t *rows = xmalloc((size_t)total * 4), *n = xmalloc((size_t)T * 4);
    for (int i = 0; i < total; i++) rows[i] = i;
    for (int i = total - 1; i > 0; i--) { /* shuffled */
        int j = irand(i + 1), t = rows[i];
        rows[i] = rows[j], rows[j] = t;
    }
    for (int t = 0; t < T; t++) n[t] = t == 0 ? K : irand(K + 1);
    const float *dy = dup(y, (size_t)total * D * 4), *dsh = sh ? dup(sh, (size_t)T * D * 4) : NULL;
    const float *dpost = dup(post, (size_t)T * hc * 4), *dcomb = dup(comb, (size_t)T * hc * hc * 4);
    const int32_t *drows = dup(rows, (size_t)total * 4), *dn = dup(n, (size_t)T * 4);
    size_t xsz = (size_t)T * hc * D * 4;
    float *x0 = dup(x, xsz), *x1 = dup(x, xsz), *out = dalloc((size_t)T * D * 4);
    poison(out, (size_t)T * D * 4);
    BT_OK_OR_DIE(bt_cuda_moe_combine(out, dy, drows, dn, K, dsh, T, D, 0));
    BT_OK_OR_DIE(bt_cuda_hc_expand(x0, out, F32, dpost, dcomb, T, hc, D, 0));
    BT_OK_OR_DIE(bt_cuda_hc_expand_moe(x1, dy, drows, dn, K, dsh, dpost, dcomb, T, hc, D, 0));
    float *a = xmalloc(xsz), *b = xmalloc(xsz);
    get(a, x0, xsz), get(b, x1, xsz);
    r->exact_ok = memcmp(a, b, xsz) == 0;
    for (size_t i = 0; i < (size_t)T * hc * D; i++)
        if (!isfinite(b[i])) r->finite = 0;
    snprintf(r->note, sizeof r->note, "exact: %s", r->exact_ok ? "same bits" : "DIFFER");
    free(y), free(sh), free(x), free(post), free(comb), free(rows), free(n), free(a), free(b);
}

/* s = M N K dim half kind: the index queries' product and their finish in one launch against
 * bt_cuda_gemm_fp8 then bt_cuda_head_finish (heads of dim, the last 2 * half channels rotated,
 * half 0: no RoPE; rounding blocks of 32 of kind), bit for bit */
static void run_fp8_qfinish(const case_t *cs, result_t *r)
{
    int M = cs->s[0], N = cs->s[1], K = cs->s[2], dim = cs->s[3], half = cs->s[4], kind = cs->s[5];
    if (!bt_cuda_gemm_fp8_qfinish_fits(M, N, K, dim)) {
        r->exact_ok = 0;
        snprintf(r->note, sizeof r->note, "the shape is not taken (bt_cuda_gemm_fp8_qfinish_fits)");
        return;
    }
    int ks = (K + 31) / 32, ns = (N + 31) / 32;
    float *x = frandv((size_t)M * K, 1.0f), *freq = xmalloc((size_t)(half > 0 ? half : 1) * 4);
    uint8_t *w8 = xmalloc((size_t)N * K), *s8 = xmalloc((size_t)ns * ks);
    for (size_t i = 0; i < (size_t)N * K; i++) w8[i] = rand_e4m3();
    for (size_t i = 0; i < (size_t)ns * ks; i++) s8[i] = (uint8_t)(120 + irand(8));
    int64_t *pos = xmalloc((size_t)M * 8);
    for (int i = 0; i < half; i++) freq[i] = powf(10000.0f, -(float)i / (float)half);
    for (int i = 0; i < M; i++) pos[i] = (int64_t)(rnd() % 100000);
    const uint16_t *dx = dup_bf16(x, (size_t)M * K);
    const uint8_t *dw = dup(w8, (size_t)N * K), *ds = dup(s8, (size_t)ns * ks);
    const float *dfreq = half ? dup(freq, (size_t)half * 4) : NULL;
    const int64_t *dpos = half ? dup(pos, (size_t)M * 8) : NULL;
    size_t ysz = (size_t)M * N * 4;
    float *a = dalloc(ysz), *b = dalloc(ysz);
    poison(a, ysz), poison(b, ysz);
    BT_OK_OR_DIE(bt_cuda_gemm_fp8(a, F32, dx, dw, ds, M, N, K, 0));
    BT_OK_OR_DIE(bt_cuda_head_finish(a, M, N / dim, dim, 0, NULL, 0.0f, dpos, dfreq, half, 32,
                                     (bt_cuda_fake_quant_t)kind, 0));
    BT_OK_OR_DIE(bt_cuda_gemm_fp8_qfinish(b, dx, dw, ds, M, N, K, dim, dpos, dfreq, half,
                                          (bt_cuda_fake_quant_t)kind, 0));
    float *ya = xmalloc(ysz), *yb = xmalloc(ysz);
    get(ya, a, ysz), get(yb, b, ysz);
    size_t diff = 0, zero = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) {
        if (memcmp(&ya[i], &yb[i], 4)) diff++;
        if (!isfinite(yb[i])) r->finite = 0;
        zero += yb[i] == 0.0f;
    }
    r->exact_ok = diff == 0 && zero < (size_t)M * N; /* (and not all rounded away) */
    snprintf(r->note, sizeof r->note, "exact: %zu of %zu differ", diff, (size_t)M * N);
    free(x), free(freq), free(w8), free(s8), free(pos), free(ya), free(yb);
}

/* bt_cuda_moe_router_logits for --perf, and the few-row product it replaced (f32) */
typedef struct {
    bt_cuda_dtype_t dt;
    void *x, *w;
    float *y, *ws;
    unsigned *ctr;
    size_t ws_n;
    int T, E, D;
} router_ctx_t;

static void launch_router(void *p)
{
    router_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_moe_router_logits(c->y, c->dt, c->x, c->D, c->w, c->T, c->E, c->D, c->ws, c->ws_n,
                                           c->ctr, 0));
}

static void launch_router_rows(void *p)
{
    router_ctx_t *c = p;
    BT_OK_OR_DIE(bt_cuda_gemm_f32(g_blas, c->y, c->E, c->x, c->D, c->w, c->T, c->E, c->D, 0));
}

/* bt_cuda_moe_router_logits against the host's sums (f32 sums of the f32 or bf16 inputs), the
 * first token launched alone the same bits as in the batch, and a relaunch (its counters left
 * for it) the same bits */
static void run_router(const case_t *cs, result_t *r)
{
    const int T = cs->s[0], E = cs->s[1], D = cs->s[2];
    const bt_cuda_dtype_t dt = cs->dt;
    float *x = frandv((size_t)T * D, 1.0f), *w = frandv((size_t)E * D, 0.05f);
    void *dx = dup_act(x, (size_t)T * D, dt), *dw = dup_act(w, (size_t)E * D, dt);
    const size_t ws_n = bt_cuda_moe_router_ws_floats(T, E, D);
    float *dws = dalloc(ws_n * 4), *dy = dalloc((size_t)T * E * 4);
    unsigned *dctr = dalloc(BT_CUDA_ROUTER_COUNTERS * 4);
    CUDA_OK(cudaMemset(dctr, 0, BT_CUDA_ROUTER_COUNTERS * 4));
    float *y[3], *ref = xmalloc((size_t)T * E * 4);
    for (int run = 0; run < 3; run++) { /* the batch, again, its first token alone */
        const int rows = run == 2 ? 1 : T;
        poison(dy, (size_t)T * E * 4);
        BT_OK_OR_DIE(bt_cuda_moe_router_logits(dy, dt, dx, D, dw, rows, E, D, dws, ws_n, dctr, 0));
        y[run] = xmalloc((size_t)T * E * 4);
        get(y[run], dy, (size_t)rows * E * 4);
    }
    for (int t = 0; t < T; t++)
        for (int e = 0; e < E; e++) {
            double acc = 0.0;
            for (int k = 0; k < D; k++) acc += (double)x[(size_t)t * D + k] * w[(size_t)e * D + k];
            ref[(size_t)t * E + e] = (float)acc;
        }
    relerr(r, y[0], ref, (size_t)T * E);
    r->bound = 1e-5; /* f32 sums either way (bf16 inputs are exact in f32) */
    const int again = memcmp(y[0], y[1], (size_t)T * E * 4) != 0, alone = memcmp(y[0], y[2], (size_t)E * 4) != 0;
    r->exact_ok = !again && !alone;
    snprintf(r->note, sizeof r->note, "relaunch %s, first token alone %s", again ? "OTHER" : "same",
             alone ? "OTHER" : "same");
    r->bytes = (double)E * D * (dt == F32 ? 4 : 2);
    if (g_perf && cs->perf) {
        router_ctx_t c = {dt, dx, dw, dy, dws, dctr, ws_n, T, E, D};
        r->ms = time_it(launch_router, &c);
        if (dt == F32)
            snprintf(r->note, sizeof r->note, "gemm_f32's few-row product %.4f ms",
                     time_it(launch_router_rows, &c));
    }
    free(y[0]), free(y[1]), free(y[2]), free(ref), free(x), free(w);
}

static void run_to_bf16(const case_t *cs, result_t *r)
{
    int rows = cs->s[0], cols = cs->s[1], ld = cols + cs->s[2];
    float *x = frandv((size_t)rows * ld, 100.0f);
    x[0] = 1.00390625f; /* a tie: 1 + 2^-8 rounds to even (1.0) */
    uint16_t *d = dalloc((size_t)rows * cols * 2), *y = xmalloc((size_t)rows * cols * 2);
    poison(d, (size_t)rows * cols * 2);
    BT_OK_OR_DIE(bt_cuda_to_bf16(d, dup(x, (size_t)rows * ld * 4), rows, cols, ld, 0));
    get(y, d, (size_t)rows * cols * 2);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            if (y[(size_t)i * cols + j] != bt_f32_to_bf16(x[(size_t)i * ld + j])) r->exact_ok = 0;
    snprintf(r->note, sizeof r->note, "bit-exact with kernels/cpu");
    free(x), free(y);
}

/* ---- driver ----------------------------------------------------------------------------- */

static void run_case(const case_t *cs, result_t *r)
{
    switch (cs->op) {
    case OP_GEMM_BF16:
    case OP_GEMM_FP8: run_gemm(cs, r); break;
    case OP_GEMM_FP4: run_gemm_fp4(cs, r); break;
    case OP_GEMM_FP8_BATCHED: run_gemm_fp8_batched(cs, r); break;
    case OP_RMSNORM: run_rmsnorm(cs, r); break;
    case OP_ROPE: run_rope(cs, r); break;
    case OP_FAKE_QUANT: run_fake_quant(cs, r); break;
    case OP_HC_MIX:
    case OP_HC_MIX_WS: run_hc_mix(cs, r); break;
    case OP_HC_COLLAPSE: run_hc_collapse(cs, r); break;
    case OP_HEAD_FINISH: run_head_finish(cs, r); break;
    case OP_HC_MIX_COLLAPSE: run_hc_mix_collapse(cs, r); break;
    case OP_HC_EC: run_hc_expand_collapse(cs, r); break;
    case OP_FP4_SWIGLU: run_fp4_swiglu(cs, r); break;
    case OP_EXPAND_MOE: run_expand_moe(cs, r); break;
    case OP_FP8_QFINISH: run_fp8_qfinish(cs, r); break;
    case OP_HC_EXPAND: run_hc_expand(cs, r); break;
    case OP_ATTENTION: run_attention(cs, r); break;
    case OP_INDEX: run_index(cs, r); break;
    case OP_TOPK: run_topk(cs, r); break;
    case OP_MOE_ROUTE: run_moe_route(cs, r); break;
    case OP_SWIGLU: run_swiglu(cs, r); break;
    case OP_ENGRAM_GATHER: run_engram_gather(cs, r); break;
    case OP_ENGRAM_INJECT: run_engram_inject(cs, r); break;
    case OP_SAMPLE: run_sample(cs, r); break;
    case OP_GEMM_F32: run_gemm_f32(cs, r); break;
    case OP_EMBED: run_embed(cs, r); break;
    case OP_GATHER: run_gather(cs, r); break;
    case OP_SCATTER: run_scatter(cs, r); break;
    case OP_COPY_RANGES: run_copy_ranges(cs, r); break;
    case OP_LOGIT_ADJUST: run_logit_adjust(cs, r); break;
    case OP_LOGIT_MASK: run_logit_mask(cs, r); break;
    case OP_HC_MEAN: run_hc_mean(cs, r); break;
    case OP_ADD_ROWS: run_add_rows(cs, r); break;
    case OP_ACT_QUANT: run_act_quant(cs, r); break;
    case OP_ATTENTION_BATCH: run_attention(cs, r); break;
    case OP_ATTENTION_TC_BATCH: run_attention(cs, r); break;
    case OP_ATTENTION_FLASH: run_attention(cs, r); break;
    case OP_SCALE: run_scale(cs, r); break;
    case OP_MOE_COMBINE: run_moe_combine(cs, r); break;
    case OP_COMPRESS: run_compress(cs, r); break;
    case OP_BLOCK_MAX: run_block_max(cs, r); break;
    case OP_MASK_BLOCKS: run_mask_blocks(cs, r); break;
    case OP_TRIM_SEL: run_trim_sel(cs, r); break;
    case OP_MOE_GROUP: run_moe_group(cs, r); break;
    case OP_ROUTER: run_router(cs, r); break;
    case OP_TO_BF16: run_to_bf16(cs, r); break;
    case OP_ATTENTION_WS: run_attention(cs, r); break;
    case OP_GEMM_FP4_LIST: run_gemm_fp4(cs, r); break;
    case OP_INDEX_SETS: run_index(cs, r); break;
    case OP_ATTENTION_TC: run_attention(cs, r); break;
    case OP_ATTENTION_TC_WS: run_attention(cs, r); break;
    case OP_INDEX_TC:
    case OP_INDEX_SETS_TC: run_index(cs, r); break;
    case OP_DEQUANT_FP8: run_dequant_fp8(cs, r); break;
    case OP_FP4_FRAG: run_fp4_frag(cs, r); break;
    }
}

/* the launchers' own argument checks: refused, nothing launched, no sticky error */
static int not_refused(bt_status_t st, const char *what)
{
    if (st == BT_ERR_INVALID_ARG) return 0;
    fprintf(stderr, "not refused: %s\n", what);
    return 1;
}
#define REFUSED(call) not_refused((call), #call)

/* a 1-token, 1-head bt_cuda_attention_tc of dim with win_stride W and sel_stride S */
static bt_status_t attention_tc_args(void *d, int dim, int W, int S)
{
    int32_t *di = d;
    return bt_cuda_attention_tc(d, d, d, di, di, W, d, di, di, S, d, d, d, 0, BT_CUDA_BF16, 1, 1,
                                dim, 0);
}

static int fits_wrong(int dim, int max_keys, int want)
{
    if (!bt_cuda_attention_tc_fits(dim, max_keys) == !want) return 0;
    fprintf(stderr, "bt_cuda_attention_tc_fits(%d, %d) != %d\n", dim, max_keys, want);
    return 1;
}

/* a 1-token bt_cuda_index_scores_tc over 8 keys, shared keys or (sets) one key set */
static bt_status_t index_tc_args(void *d, int sets, int heads, int dim)
{
    return bt_cuda_index_scores_tc(d, d, d, d, sets ? d : NULL, sets ? d : NULL, d, 1, heads, dim,
                                   8, 0);
}

/* Kernels launched one after another on a stream may start before the one before them ends
 * (programmatic dependent launch, kernels/cuda/common.cuh); each must still see all that one
 * wrote. One block copies an array of bf16 rows (~2 ms: the copy's last bytes land long after
 * the next kernel could start), a few-row FP8 product reads the last rows (it loads its first
 * weights before it waits: where an early read would hide), a scale doubles the product's
 * output; the copy's destination and the output poisoned before each round. Returns the
 * count of rounds whose output differs from twice the host's product. */
static int check_launch_order(void)
{
    enum { ROWS = 800, COLS = 5120, M = 4, N = 1024, ROUNDS = 20 };
    const size_t n = (size_t)ROWS * COLS;
    const int ks = COLS / 32, ns = N / 32;
    float *x = frandv(n, 1.0f), *w = xmalloc((size_t)N * COLS * 4);
    uint8_t *w8 = xmalloc((size_t)N * COLS), *s8 = xmalloc((size_t)ns * ks);
    for (int i = 0; i < ns * ks; i++)
        s8[i] = (uint8_t)(120 + irand(8));
    for (int r = 0; r < N; r++)
        for (int k = 0; k < COLS; k++) {
            w8[(size_t)r * COLS + k] = rand_e4m3();
            w[(size_t)r * COLS + k] = bt_e4m3_to_f32(w8[(size_t)r * COLS + k]) *
                                      bt_e8m0_to_f32(s8[(size_t)(r / 32) * ks + k / 32]);
        }
    const uint16_t *d_good = dup_bf16(x, n); /* (x rounded to what the GPU gets) */
    double *ref = xmalloc((size_t)M * N * sizeof(double));
    for (int m = 0; m < M; m++)
        for (int c = 0; c < N; c++) {
            double acc = 0.0;
            const float *xr = x + n - (size_t)(M - m) * COLS, *wr = w + (size_t)c * COLS;
            for (int k = 0; k < COLS; k++)
                acc += (double)xr[k] * wr[k];
            ref[(size_t)m * N + c] = 2.0 * acc;
        }
    const uint8_t *d_w8 = dup(w8, (size_t)N * COLS), *d_s8 = dup(s8, (size_t)ns * ks);
    uint16_t *d_x = dalloc(n * 2);
    const bt_cuda_copy_t copy = {d_good, d_x, n * 2};
    const bt_cuda_copy_t *d_copy = dup(&copy, sizeof copy);
    float *d_y = dalloc((size_t)M * N * 4), *y = xmalloc((size_t)M * N * 4);
    int bad = 0;
    for (int round = 0; round < ROUNDS; round++) {
        poison(d_x, n * 2);
        poison(d_y, (size_t)M * N * 4);
        BT_OK_OR_DIE(bt_cuda_copy_ranges(d_copy, 1, 0));
        BT_OK_OR_DIE(bt_cuda_gemm_fp8(d_y, BT_CUDA_F32, d_x + n - (size_t)M * COLS, d_w8, d_s8, M,
                                      N, COLS, 0));
        BT_OK_OR_DIE(bt_cuda_scale(d_y, (size_t)M * N, 2.0f, 0));
        get(y, d_y, (size_t)M * N * 4);
        double num = 0.0, den = 0.0;
        int finite = 1;
        for (int i = 0; i < M * N; i++) {
            finite &= isfinite(y[i]) != 0;
            num += (y[i] - ref[i]) * (y[i] - ref[i]);
            den += ref[i] * ref[i];
        }
        if (!finite || !(sqrt(num / den) <= 1e-5)) bad++;
    }
    dfree_all();
    free(x), free(w), free(w8), free(s8), free(ref), free(y);
    return bad;
}

static int check_refusals(void)
{
    int bad = 0;
    enum { BYTES = 1 << 16 };
    float *d = dalloc(BYTES);
    CUDA_OK(cudaMemset(d, 0, BYTES)); /* zero counts and indices: a wrong launch stays in bounds */
    bad += REFUSED(bt_cuda_rmsnorm(d, BT_CUDA_F32, d, (bt_cuda_dtype_t)7, NULL, 1, 4, 1e-6f, 0));
    bad += REFUSED(bt_cuda_hc_expand_collapse(d, d, BT_CUDA_F32, d, d, d + 64, BT_CUDA_F32, d, NULL,
                                              100, 3, 4, 1e-6f, 0)); /* hc 3 */
    bad += REFUSED(bt_cuda_gemm_fp4_grouped(d, BT_CUDA_F32, (uint16_t *)d, NULL, (int32_t *)d, 1,
                                            1, (uint8_t *)d, (uint8_t *)d, 4, 33, 0));
    bad += REFUSED(bt_cuda_gemm_fp4_grouped(d, BT_CUDA_F32, (uint16_t *)d, NULL, (int32_t *)d, 1,
                                            1, (uint8_t *)d + 8, (uint8_t *)d, 4, 32, 0));
    bad += REFUSED(bt_cuda_fp4_to_frag((uint8_t *)d, 24, 0)); /* not whole runs */
    bad += REFUSED(bt_cuda_fp4_to_frag((uint8_t *)d + 8, 16, 0)); /* not 16-byte aligned */
    bad += REFUSED(bt_cuda_attention(d, d, d, (int32_t *)d, (int32_t *)d, 1, NULL, NULL, NULL, 0,
                                     d, NULL, NULL, 0, BT_CUDA_F32, 1, 1, 101, 0));
    { /* split per token with a workspace short of every token's splits: fewer splits would
       * change a token's result with its batch */
        bt_cuda_attention_batch_t per = {NULL, NULL, true};
        bad += REFUSED(bt_cuda_attention_tc_ws(d, d, d, (int32_t *)d, (int32_t *)d, 128, NULL, NULL, NULL,
                                               0, d, (int64_t *)d, NULL, 0, BT_CUDA_BF16, 2, 64, 512, d, 64, &per, 0));
        bad += REFUSED(bt_cuda_attention_ws(d, d, d, (int32_t *)d, (int32_t *)d, 128, NULL, NULL, NULL, 0,
                                            d, (int64_t *)d, NULL, 0, BT_CUDA_BF16, 2, 64, 512, d, 64, &per, 0));
    }
    bad += REFUSED(bt_cuda_gemm_f32(g_blas, d, 4, d, 3, d, 2, 4, 4, 0)); /* ldx < K */
    /* the router's logits: 17 tokens; D off 4; a workspace one float short */
    bad += REFUSED(bt_cuda_moe_router_logits(d, BT_CUDA_F32, d, 64, d, 17, 8, 64, d, 1 << 20,
                                             (unsigned *)d, 0));
    bad += REFUSED(bt_cuda_moe_router_logits(d, BT_CUDA_F32, d, 66, d, 1, 8, 66, d, 1 << 20,
                                             (unsigned *)d, 0));
    bad += REFUSED(bt_cuda_moe_router_logits(d, BT_CUDA_F32, d, 64, d, 2, 8, 64, d,
                                             bt_cuda_moe_router_ws_floats(2, 8, 64) - 1,
                                             (unsigned *)d, 0));
    bad += REFUSED(bt_cuda_compress_pool(d, d, d, 0, 4, 8, 0));
    /* w13 with SwiGLU: I off 32; 17 rows an expert with K off 128 (17 rows are taken on Hopper,
     * by gemm_fp4_wgrs' SW form, where K is whole 128-chunks); the combine in an expand of hc 3 */
    bad += REFUSED(bt_cuda_gemm_fp4_swiglu_list(d, BT_CUDA_BF16, (uint16_t *)d, NULL, (int32_t *)d, (int32_t *)d,
                                                1, 1, (uint8_t *)d, (uint8_t *)d, 48, 1024, NULL, 0.0f, 0));
    bad += REFUSED(bt_cuda_gemm_fp4_swiglu_list(d, BT_CUDA_BF16, (uint16_t *)d, NULL, (int32_t *)d, (int32_t *)d,
                                                1, 17, (uint8_t *)d, (uint8_t *)d, 64, 1088, NULL, 0.0f, 0));
    bad += REFUSED(bt_cuda_hc_expand_moe(d, d, (int32_t *)d, (int32_t *)d, 2, NULL, d, d, 1, 3, 64, 0));
    /* the queries' finish: heads of 48 (not whole rounding blocks); 9 rows; half past the head */
    bad += REFUSED(bt_cuda_gemm_fp8_qfinish(d, (uint16_t *)d, (uint8_t *)d, (uint8_t *)d, 1, 96, 64, 48, NULL,
                                            NULL, 0, BT_CUDA_FQ_FP4_UE8M0, 0));
    bad += REFUSED(bt_cuda_gemm_fp8_qfinish(d, (uint16_t *)d, (uint8_t *)d, (uint8_t *)d, 9, 128, 64, 32, NULL,
                                            NULL, 0, BT_CUDA_FQ_FP4_UE8M0, 0));
    bad += REFUSED(bt_cuda_gemm_fp8_qfinish(d, (uint16_t *)d, (uint8_t *)d, (uint8_t *)d, 1, 128, 64, 32,
                                            (int64_t *)d, d, 17, BT_CUDA_FQ_FP4_UE8M0, 0));
    bad += REFUSED(bt_cuda_topk((int32_t *)d, (int32_t *)d, 4, d, 1, 10, 5, 0));
    /* the collapse's weights the mix's own output (the two run side by side) */
    bad += REFUSED(bt_cuda_hc_mix_collapse_ws(d, d, d, d, d, d, d, 1, 4, 64, 1e-6f, 1e-6f, 1, d,
                                              BYTES / 4, d, BT_CUDA_F32, d, NULL, 1e-6f, 0));
    /* a norm over several heads; a head over 4096 */
    bad += REFUSED(bt_cuda_head_finish(d, 1, 2, 64, 1, NULL, 1e-6f, NULL, NULL, 0, 0, 0, 0));
    bad += REFUSED(bt_cuda_head_finish(d, 1, 1, 4097, 0, NULL, 1e-6f, NULL, NULL, 0, 0, 0, 0));
    /* three streams: the collapse is built for 1, 2 and 4 (as the mix) */
    bad += REFUSED(bt_cuda_hc_collapse_norm(d, BT_CUDA_F32, d, d, NULL, 1, 3, 8, 1e-6f, 0));
    bad += REFUSED(bt_cuda_copy_ranges(NULL, 1, 0));
    bad += REFUSED(bt_cuda_logit_adjust((float *)d, 10, NULL, 1, 0));
    bad += REFUSED(bt_cuda_logit_adjust((float *)d, 10, (const bt_cuda_logit_adjust_t *)d, 0, 0));
    bad += REFUSED(bt_cuda_logit_mask((float *)d, 10, NULL, 1, 1, 10, 0));
    bad += REFUSED(bt_cuda_logit_mask((float *)d, 10, (const uint32_t *)d, 0, 1, 40, 0));
    bad += REFUSED(bt_cuda_copy_ranges((const bt_cuda_copy_t *)d, 0, 0));
    /* tensor-core attention: dim off 16, dim over 512, more keys than one block holds */
    bad += REFUSED(attention_tc_args(d, 18, 128, 512));
    bad += REFUSED(attention_tc_args(d, 528, 128, 512));
    bad += REFUSED(attention_tc_args(d, 512, 128, BT_CUDA_ATTENTION_TC_MAX_KEYS - 127));
    bad += fits_wrong(512, 640, 1) + fits_wrong(16, BT_CUDA_ATTENTION_TC_MAX_KEYS, 1);
    bad += fits_wrong(18, 640, 0) + fits_wrong(528, 640, 0);
    /* the flash form: dim off 8, dim over 512, a float q 4 bytes off 16-byte alignment */
    const uint16_t *k16 = (const uint16_t *)d;
    const int32_t *di = (const int32_t *)d;
    const float *df = (const float *)d;
    const int64_t *dl = (const int64_t *)d;
    bad += REFUSED(bt_cuda_attention_flash(d, d, BT_CUDA_F32, k16, di, di, 128, NULL, NULL, NULL,
                                           0, df, dl, NULL, 0, 1, 1, 20, NULL, 0));
    bad += REFUSED(bt_cuda_attention_flash(d, d, BT_CUDA_F32, k16, di, di, 128, NULL, NULL, NULL,
                                           0, df, dl, NULL, 0, 1, 1, 520, NULL, 0));
    bad += REFUSED(bt_cuda_attention_flash(d, (char *)d + 4, BT_CUDA_F32, k16, di, di, 128, NULL,
                                           NULL, NULL, 0, df, dl, NULL, 0, 1, 1, 64, NULL, 0));
    if (bt_cuda_attention_flash_fits(20) || bt_cuda_attention_flash_fits(520)) {
        fprintf(stderr, "bt_cuda_attention_flash_fits takes dim 20 or 520\n");
        bad++;
    }
    bad += fits_wrong(512, BT_CUDA_ATTENTION_TC_MAX_KEYS + 1, 0);
    /* tensor-core indexer: dim over 128, heads over 32 */
    for (int sets = 0; sets < 2; sets++) {
        bad += REFUSED(index_tc_args(d, sets, 32, 144));
        bad += REFUSED(index_tc_args(d, sets, 33, 128));
    }
    bad += cudaGetLastError() != cudaSuccess;
    dfree_all();
    return bad;
}

/* name is one of the comma-separated list */
static bool name_listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

int main(int argc, char **argv)
{
    uint64_t seed = (uint64_t)time(NULL) * 2654435761u;
    const char *only = NULL; /* comma-separated op names */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf"))
            g_perf = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--perf] [--seed N] [--only OP[,OP...]]\n", argv[0]);
            return 2;
        }
    }
    g_rng = seed ? seed : 1;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "test_cuda_ops: no CUDA device\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    g_sm_major = prop.major;
    printf("device: %s, %d SMs, sm_%d%d; seed %llu\n", prop.name, prop.multiProcessorCount,
           prop.major, prop.minor, (unsigned long long)seed);
    BT_OK_OR_DIE(bt_cuda_blas_create(&g_blas));
    CUDA_OK(cudaEventCreate(&g_e0));
    CUDA_OK(cudaEventCreate(&g_e1));

    int failed = 0, run = 0;
    int refusals = check_refusals();
    uint64_t rng = g_rng; /* (the cases draw the inputs they drew before this check existed) */
    int disordered = check_launch_order();
    g_rng = rng;
    printf("kernels see what the kernel before them wrote: %s (%d of 20 rounds wrong)\n",
           disordered ? "FAIL" : "ok", disordered);
    printf("%-4s %-16s %-4s %-34s %10s %8s %9s %9s  %s\n", "", "op", "dt", "shape", "rel.err",
           "bound", "ms", "floor ms", "note");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const case_t *cs = &cases[i];
        if (cs->perf && !g_perf) continue;
        if (only && !name_listed(only, op_names[cs->op])) continue;
        result_t r = {0};
        r.finite = 1;
        r.exact_ok = 1;
        r.bound = bound_for(cs->dt);
        run_case(cs, &r);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaGetLastError());
        int ok = r.finite && r.exact_ok && r.err <= r.bound;
        failed += !ok;
        run++;
        char shape[80];
        snprintf(shape, sizeof(shape), "%d %d %d %d %d %d", cs->s[0], cs->s[1], cs->s[2],
                 cs->s[3], cs->s[4], cs->s[5]);
        if (cs->s[6]) snprintf(shape + strlen(shape), sizeof(shape) - strlen(shape), " %d", cs->s[6]);
        /* the floor: the fewest bytes at 4.3 TB/s, the FLOPs at ~790 TFLOP/s (bf16 tensor
         * cores; the rates measured on this workplace's H200s) */
        double floor_ms = r.bytes / 4.3e12 * 1e3;
        double fl = r.flops / 790e12 * 1e3;
        if (fl > floor_ms) floor_ms = fl;
        char ms[16] = "-", fms[16] = "-";
        if (r.ms > 0) {
            snprintf(ms, sizeof(ms), "%.4f", r.ms);
            snprintf(fms, sizeof(fms), "%.4f", floor_ms);
        }
        printf("%-4s %-16s %-4s %-34s %10.3g %8.0e %9s %9s  %s%s\n", ok ? "ok" : "FAIL",
               op_names[cs->op], cs->dt == BF16 ? "bf16" : "f32", shape, r.err, r.bound, ms, fms,
               r.finite ? "" : "NON-FINITE OUTPUT ", r.note);
        dfree_all();
    }
    printf("refused bad arguments: %s\n", refusals ? "FAIL" : "ok");
    printf("%d of %d cases passed\n", run - failed, run);
    bt_cuda_blas_destroy(g_blas);
    return failed || refusals || disordered ? 1 : 0;
}
