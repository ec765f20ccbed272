/* DeepSeek-V4.1 forward pass on the CPU backend. The maths follows the transformers port
 * (src/transformers/models/deepseek_v41, cached path), which the golden fixtures come from;
 * MODEL-DS41.md summarises it. Where the official reference and transformers differ, this
 * follows transformers and says so. */
#include "services/engine/model.h"

#include "common/alloc.h"
#include "common/log.h"
#include "common/comm/comm.h"
#include "common/threads.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "services/engine/engram_hash.h"
#include "services/engine/model_impl.h"
#include "services/engine/safetensors.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bt_model_options_t bt_model_options_default(void)
{
    bt_model_options_t o;
    memset(&o, 0, sizeof o);
    o.max_batch_tokens = 4096;
    o.max_ctx = 8192;
    o.max_batch_seqs = 16;
    return o;
}

const bt_model_config_t *bt_model_config(const bt_model_t *m)
{
    return &m->cfg;
}

int bt_model_tp_rank(const bt_model_t *m)
{
    return m->tp_rank;
}

int bt_model_tp_size(const bt_model_t *m)
{
    return m->tp_size;
}

void bt_model_set_tap(bt_model_t *m, bt_tap_fn fn, void *ctx)
{
    m->tap = fn;
    m->tap_ctx = ctx;
}

static void *track(bt_model_t *m, void *p)
{
    if (m->n_allocs == m->cap_allocs) {
        m->cap_allocs = m->cap_allocs ? 2 * m->cap_allocs : 256;
        m->allocs = bt_realloc_or_die(m->allocs, (size_t)m->cap_allocs * sizeof(void *));
    }
    m->allocs[m->n_allocs++] = p;
    return p;
}

static void *alloc_floats(bt_model_t *m, size_t n)
{
    m->host_bytes += n * sizeof(float);
    void *p = bt_aligned_alloc(64, n * sizeof(float));
    if (!p) {
        BT_LOG_ERROR("out of memory (%zu floats)", n);
        abort();
    }
    return track(m, p);
}

/* ---- loading ------------------------------------------------------------------------ */

typedef struct {
    bt_model_t *m;
    const bt_safetensors_t *st;
    char *err;
    size_t errlen;
    bt_status_t st_code;
} loader_t;

static float *load(loader_t *ld, const char *name, int ndim, int64_t d0, int64_t d1, float *into)
{
    if (ld->st_code != BT_OK) return NULL;
    int64_t shape[2] = {d0, d1};
    size_t n = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    float *dst = into ? into : alloc_floats(ld->m, n);
    bt_status_t st = bt_safetensors_read_f32(ld->st, name, ndim, shape, dst, ld->err, ld->errlen);
    if (st != BT_OK) {
        ld->st_code = st;
        return NULL;
    }
    return dst;
}

/* Rows [r0, r0 + nr) of a [rows, cols] tensor (1-D when cols == 0); the whole tensor is read
 * and only the slice kept. */
static float *load_rows(loader_t *ld, const char *name, int64_t rows, int64_t cols, int64_t r0, int64_t nr,
                        float *into)
{
    if (ld->st_code != BT_OK) return NULL;
    if (r0 == 0 && nr == rows) return load(ld, name, cols ? 2 : 1, rows, cols, into);
    size_t width = (size_t)(cols ? cols : 1);
    float *full = bt_malloc_or_die((size_t)rows * width * sizeof(float));
    float *dst = NULL;
    if (load(ld, name, cols ? 2 : 1, rows, cols, full)) {
        dst = into ? into : alloc_floats(ld->m, (size_t)(nr > 0 ? nr : 1) * width);
        memcpy(dst, full + (size_t)r0 * width, (size_t)nr * width * sizeof(float));
    }
    free(full);
    return dst;
}

/* Columns [c0, c0 + nc) of a [rows, cols] tensor. */
static float *load_cols(loader_t *ld, const char *name, int64_t rows, int64_t cols, int64_t c0, int64_t nc,
                        float *into)
{
    if (ld->st_code != BT_OK) return NULL;
    if (c0 == 0 && nc == cols) return load(ld, name, 2, rows, cols, into);
    float *full = bt_malloc_or_die((size_t)rows * (size_t)cols * sizeof(float));
    float *dst = NULL;
    if (load(ld, name, 2, rows, cols, full)) {
        dst = into ? into : alloc_floats(ld->m, (size_t)rows * (size_t)nc);
        for (int64_t r = 0; r < rows; r++)
            memcpy(dst + (size_t)r * nc, full + (size_t)r * cols + c0, (size_t)nc * sizeof(float));
    }
    free(full);
    return dst;
}

/* whether tensor `name` is stored FP8 e4m3 or packed FP4 (I8): the linears whose inputs the
 * reference deployment quantizes (bt_model_options_t.activation_quant) */
static bool stored_lowp(const loader_t *ld, const char *name)
{
    const bt_tensor_view_t *t = bt_safetensors_find(ld->st, name);
    return t && (t->dtype == BT_DTYPE_F8_E4M3 || t->dtype == BT_DTYPE_I8);
}

/* AQ_* bit `bit` when prefix.suffix is stored FP8/FP4 */
static unsigned lowp_bit(const loader_t *ld, const char *prefix, const char *suffix, unsigned bit)
{
    char name[256];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return stored_lowp(ld, name) ? bit : 0u;
}

/* prefix.suffix, e.g. layers.3 + attn_norm.weight */
static float *loadp(loader_t *ld, int ndim, int64_t d0, int64_t d1, const char *prefix,
                    const char *suffix)
{
    char name[256];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return load(ld, name, ndim, d0, d1, NULL);
}

static void load_layer(loader_t *ld, int l)
{
    bt_model_t *m = ld->m;
    const bt_model_config_t *c = &m->cfg;
    const bt_layer_config_t *L = &c->layer[l];
    layer_weights_t *w = &m->layer[l];
    /* the draft stages are stored as mtp.0, mtp.1, ... after the backbone's layers.N */
    bool draft = l >= c->n_layers;
    char P[32];
    snprintf(P, sizeof P, draft ? "mtp.%d" : "layers.%d", draft ? l - c->n_layers : l);
    int D = c->hidden, hd = c->head_dim, H = c->n_heads, hc = c->hc_mult;
    int mix = (2 + hc) * hc;

    w->attn_norm = loadp(ld, 1, D, 0, P, "attn_norm.weight");
    w->ffn_norm = loadp(ld, 1, D, 0, P, "ffn_norm.weight");
    w->hc_attn_fn = loadp(ld, 2, mix, (int64_t)hc * D, P, "hc_attn_fn");
    w->hc_attn_base = loadp(ld, 1, mix, 0, P, "hc_attn_base");
    w->hc_attn_scale = loadp(ld, 1, 3, 0, P, "hc_attn_scale");
    w->hc_ffn_fn = loadp(ld, 2, mix, (int64_t)hc * D, P, "hc_ffn_fn");
    w->hc_ffn_base = loadp(ld, 1, mix, 0, P, "hc_ffn_base");
    w->hc_ffn_scale = loadp(ld, 1, 3, 0, P, "hc_ffn_scale");

    /* wo_a is not among them: the reference runs it dequantized, its input as is */
    w->lowp = lowp_bit(ld, P, "attn.wq_a.weight", AQ_WQ_A) |
              lowp_bit(ld, P, "attn.wq_b.weight", AQ_WQ_B) |
              lowp_bit(ld, P, "attn.wkv.weight", AQ_WKV) |
              lowp_bit(ld, P, "attn.wo_b.weight", AQ_WO_B) |
              lowp_bit(ld, P, "attn.compressor.wkv.weight", AQ_C_WKV) |
              lowp_bit(ld, P, "attn.compressor.wgate.weight", AQ_C_WGATE) |
              lowp_bit(ld, P, "attn.indexer.wq_b.weight", AQ_I_WQ_B) |
              lowp_bit(ld, P, "attn.indexer.weights_proj.weight", AQ_I_WPROJ) |
              lowp_bit(ld, P, "attn.indexer.wk.weight", AQ_I_WK) |
              lowp_bit(ld, P, "ffn.shared_experts.w1.weight", AQ_SHARED13) |
              lowp_bit(ld, P, "ffn.shared_experts.w2.weight", AQ_SHARED2) |
              lowp_bit(ld, P, "engram.wkv.weight", AQ_E_WKV);
    w->wq_a = loadp(ld, 2, c->q_lora_rank, D, P, "attn.wq_a.weight");
    w->q_norm = loadp(ld, 1, c->q_lora_rank, 0, P, "attn.q_norm.weight");
    char nm[256];
    snprintf(nm, sizeof nm, "%s.attn.wq_b.weight", P);
    w->wq_b = load_rows(ld, nm, (int64_t)H * hd, c->q_lora_rank, (int64_t)m->h0 * hd, (int64_t)m->hl * hd, NULL);
    w->wkv = loadp(ld, 2, hd, D, P, "attn.wkv.weight");
    w->kv_norm = loadp(ld, 1, hd, 0, P, "attn.kv_norm.weight");
    int64_t R = c->o_lora_rank;
    snprintf(nm, sizeof nm, "%s.attn.wo_a.weight", P);
    w->wo_a = load_rows(ld, nm, (int64_t)c->o_groups * R, (int64_t)H * hd / c->o_groups,
                        (int64_t)m->g0 * R, (int64_t)m->gl * R, NULL);
    snprintf(nm, sizeof nm, "%s.attn.wo_b.weight", P);
    w->wo_b = load_cols(ld, nm, D, (int64_t)c->o_groups * R, (int64_t)m->g0 * R, (int64_t)m->gl * R, NULL);
    snprintf(nm, sizeof nm, "%s.attn.attn_sink", P);
    w->attn_sink = load_rows(ld, nm, H, 0, m->h0, m->hl, NULL);

    if (L->is_kv_source) {
        w->c_wkv = loadp(ld, 2, hd, D, P, "attn.compressor.wkv.weight");
        if (L->compress_ratio > 1)
            w->c_wgate = loadp(ld, 2, hd, D, P, "attn.compressor.wgate.weight");
        w->c_norm = loadp(ld, 1, hd, 0, P, "attn.compressor.norm.weight");
    }
    if (L->is_index_source) {
        int ih = c->index_heads, ihd = c->index_head_dim;
        w->i_wq_b = loadp(ld, 2, (int64_t)ih * ihd, c->q_lora_rank, P, "attn.indexer.wq_b.weight");
        w->i_weights_proj = loadp(ld, 2, ih, D, P, "attn.indexer.weights_proj.weight");
        if (L->is_kv_source) {
            w->i_wk = loadp(ld, 2, ihd, hd, P, "attn.indexer.wk.weight");
            w->i_k_norm = loadp(ld, 1, ihd, 0, P, "attn.indexer.k_norm.weight");
        }
    }

    int E = draft ? c->draft_experts : c->n_experts, I = c->moe_inter;
    w->n_experts = E;
    w->n_active = draft ? c->draft_active : c->n_active;
    w->gate_w = loadp(ld, 2, E, D, P, "ffn.gate.weight");
    w->gate_bias = loadp(ld, 1, E, 0, P, "ffn.gate.bias");
    if (ld->st_code != BT_OK) return;
    /* each rank keeps its slice [i0, i0 + il) of every expert's width */
    int Il = m->il;
    w->w1 = alloc_floats(m, (size_t)E * Il * D);
    w->w2 = alloc_floats(m, (size_t)E * Il * D);
    w->w3 = alloc_floats(m, (size_t)E * Il * D);
    for (int e = 0; e < E && ld->st_code == BT_OK; e++) {
        char name[256];
        /* (the checkpoints store every expert alike; any stored low-precision counts) */
        snprintf(name, sizeof name, "%s.ffn.experts.%d.w1.weight", P, e);
        if (stored_lowp(ld, name)) w->lowp |= AQ_W13;
        load_rows(ld, name, I, D, m->i0, Il, w->w1 + (size_t)e * Il * D);
        snprintf(name, sizeof name, "%s.ffn.experts.%d.w2.weight", P, e);
        if (stored_lowp(ld, name)) w->lowp |= AQ_W2;
        load_cols(ld, name, D, I, m->i0, Il, w->w2 + (size_t)e * Il * D);
        snprintf(name, sizeof name, "%s.ffn.experts.%d.w3.weight", P, e);
        load_rows(ld, name, I, D, m->i0, Il, w->w3 + (size_t)e * Il * D);
    }
    if (c->n_shared) {
        snprintf(nm, sizeof nm, "%s.ffn.shared_experts.w1.weight", P);
        w->sw1 = load_rows(ld, nm, I, D, m->i0, Il, NULL);
        snprintf(nm, sizeof nm, "%s.ffn.shared_experts.w2.weight", P);
        w->sw2 = load_cols(ld, nm, D, I, m->i0, Il, NULL);
        snprintf(nm, sizeof nm, "%s.ffn.shared_experts.w3.weight", P);
        w->sw3 = load_rows(ld, nm, I, D, m->i0, Il, NULL);
    }

    if (L->engram_index >= 0) {
        int ei = L->engram_index, ehd = c->engram_head_dim;
        int cols = m->engram_cols;
        w->e_embed = loadp(ld, 2, c->engram_rows[ei], ehd, P, "engram.embed.weight");
        w->e_wkv = loadp(ld, 2, (int64_t)(hc + 1) * D, (int64_t)cols * ehd, P, "engram.wkv.weight");
        float *qw = loadp(ld, 2, hc, D, P, "engram.q_weight");
        float *kw = loadp(ld, 2, hc, D, P, "engram.k_weight");
        if (ld->st_code == BT_OK) {
            /* the reference only ever uses q_weight * k_weight */
            w->e_qk = alloc_floats(m, (size_t)hc * D);
            for (int i = 0; i < hc * D; i++) w->e_qk[i] = qw[i] * kw[i];
        }
    }
}

static void alloc_scratch(bt_model_t *m)
{
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    size_t N = (size_t)m->opt.max_batch_tokens;
    size_t D = (size_t)c->hidden, hc = (size_t)c->hc_mult, hd = (size_t)c->head_dim;
    size_t H = (size_t)c->n_heads;
    s->tok_seq = track(m, bt_calloc_or_die(N, sizeof(int)));
    s->tok_pos = track(m, bt_calloc_or_die(N, sizeof(int64_t)));
    s->x = alloc_floats(m, N * hc * D);
    s->pre_mix = alloc_floats(m, N * hc);
    s->attn_pre = alloc_floats(m, N * hc);
    s->post = alloc_floats(m, N * hc);
    s->comb = alloc_floats(m, N * hc * hc);
    s->xin = alloc_floats(m, N * D);
    s->out = alloc_floats(m, N * D);
    s->q_res = alloc_floats(m, N * (size_t)c->q_lora_rank);
    s->q = alloc_floats(m, N * (size_t)m->hl * hd);
    s->kv = alloc_floats(m, N * hd);
    s->ckv = alloc_floats(m, N * hd);
    s->cgate = alloc_floats(m, N * hd);
    s->attn = alloc_floats(m, N * H * hd); /* this rank's heads, or all of them once gathered */
    if (m->tp_size > 1) {
        size_t g1 = N * H * hd, g2 = N * (size_t)m->vpad * (size_t)m->tp_size;
        m->gather = alloc_floats(m, g1 > g2 ? g1 : g2);
        m->tp_logits = alloc_floats(m, N * (size_t)m->vpad);
    }
    s->oa = alloc_floats(m, N * (size_t)m->gl * (size_t)c->o_lora_rank);
    s->qi = alloc_floats(m, N * (size_t)c->index_heads * (size_t)c->index_head_dim);
    s->iw = alloc_floats(m, N * (size_t)c->index_heads);
    s->cos_main = alloc_floats(m, N * (size_t)m->half_main);
    s->sin_main = alloc_floats(m, N * (size_t)m->half_main);
    s->cos_comp = alloc_floats(m, N * (size_t)m->half_comp);
    s->sin_comp = alloc_floats(m, N * (size_t)m->half_comp);
    size_t topk = (size_t)c->index_topk, blocks = (size_t)(c->candidate_topk_blocks > 0 ? c->candidate_topk_blocks : 1);
    s->topk = track(m, bt_calloc_or_die(N * topk, sizeof(int32_t)));
    s->topk_n = track(m, bt_calloc_or_die(N, sizeof(int)));
    s->topk_set = track(m, bt_calloc_or_die(N, 1));
    s->cand = track(m, bt_calloc_or_die(N * blocks, sizeof(int32_t)));
    s->cand_n = track(m, bt_calloc_or_die(N, sizeof(int)));
    s->cand_set = track(m, bt_calloc_or_die(N, 1));
    size_t cols = (size_t)(m->engram_cols ? m->engram_cols : 1);
    s->hash = track(m, bt_calloc_or_die(N * (size_t)(c->n_engram ? c->n_engram : 1) * cols, sizeof(int64_t)));
    s->cid = track(m, bt_calloc_or_die(N, sizeof(int64_t)));
    s->probs_stride =
        (size_t)c->window + (topk > (size_t)c->draft_block ? topk : (size_t)c->draft_block);
    s->probs = alloc_floats(m, N * s->probs_stride);
    s->hidden = alloc_floats(m, N * D);
    if (m->opt.activation_quant) { /* the widest input of a quantized linear */
        size_t k = D, q = (size_t)c->q_lora_rank, o = (size_t)m->gl * (size_t)c->o_lora_rank;
        size_t dm = (size_t)c->n_draft_targets * D;
        s->aq_cols = k > q ? k : q;
        if (o > s->aq_cols) s->aq_cols = o;
        if (c->n_draft && dm > s->aq_cols) s->aq_cols = dm;
        s->aq_rows = alloc_floats(m, N * s->aq_cols);
    }
    if (c->n_draft) {
        s->main_hidden = alloc_floats(m, N * (size_t)c->n_draft_targets * D);
        s->main_x = alloc_floats(m, N * D);
        s->draft_pre = alloc_floats(m, N * D);
        /* a draft's rows of logits and the Markov bias row; its block's ids */
        size_t rows = (size_t)m->opt.max_batch_seqs * (size_t)c->draft_block;
        m->draft_logits = alloc_floats(m, (rows + 1) * (size_t)c->vocab);
        m->draft_ids = track(m, bt_calloc_or_die(rows, sizeof(int32_t)));
    }
    /* the draft stages route over their own experts */
    size_t E = (size_t)c->n_experts, K = (size_t)c->n_active;
    if (c->n_draft && (size_t)c->draft_experts > E) E = (size_t)c->draft_experts;
    if (c->n_draft && (size_t)c->draft_active > K) K = (size_t)c->draft_active;

    s->n_tasks = bt_threads_count(m->pool);
    s->task_keys =
        track(m, bt_calloc_or_die((size_t)s->n_tasks * s->probs_stride, sizeof *s->task_keys));
    size_t entries = (size_t)m->opt.max_ctx; /* ratio >= 1: at most one entry per position */
    size_t nblocks = entries / (size_t)c->candidate_block_size + 1;
    size_t per_scores = entries > nblocks ? entries : nblocks;
    s->task_scores = alloc_floats(m, (size_t)s->n_tasks * (per_scores + 1));
    size_t heap = topk > blocks ? topk : blocks;
    if (K > heap) heap = K;
    s->task_idx = track(m, bt_calloc_or_die((size_t)s->n_tasks * heap, sizeof(int32_t)));
    s->task_bscore = alloc_floats(m, (size_t)s->n_tasks * heap);
    m->moe_task_floats = 2 * (size_t)c->moe_inter + E + 2 * D; /* (+ D: the input quantized) */
    m->heap_len = heap;
    s->task_moe = alloc_floats(m, (size_t)s->n_tasks * m->moe_task_floats);
    size_t eng = cols * (size_t)c->engram_head_dim + (hc + 1) * D;
    s->task_engram = alloc_floats(m, (size_t)s->n_tasks * eng);
}

int bt_act_quant_parse(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "none")) return 0;
    if (!strcmp(name, "fp8")) return 1;
    return -1;
}

int bt_device_parse(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "cpu")) return BT_DEVICE_CPU;
    if (!strcmp(name, "cuda")) return BT_DEVICE_CUDA;
    return -1;
}

int bt_weights_parse(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "auto")) return BT_WEIGHTS_AUTO;
    if (!strcmp(name, "float32")) return BT_WEIGHTS_F32;
    if (!strcmp(name, "bfloat16")) return BT_WEIGHTS_BF16;
    return -1;
}

bool bt_device_cuda_built(void)
{
#ifdef BT_HAVE_CUDA_MODEL
    return true;
#else
    return false;
#endif
}

void bt_model__free_tracked(bt_model_t *m, void *p)
{
    if (!p) return;
    for (int i = 0; i < m->n_allocs; i++) {
        if (m->allocs[i] != p) continue;
        free(p);
        m->allocs[i] = m->allocs[--m->n_allocs];
        return;
    }
}

static bt_status_t load_cpu(const char *dir, const bt_model_options_t *opt, bt_model_t **model_p,
                            char *err, size_t errlen, bool report);

/* The device backend loads through the CPU loader (every check of the checkpoint, the
 * shards, the engram constants), with scratch for one token, and then takes the weights. */
static bt_status_t load_cuda(const char *dir, const bt_model_options_t *opt, bt_model_t **model_p,
                             char *err, size_t errlen)
{
#ifdef BT_HAVE_CUDA_MODEL
    bt_model_options_t host = *opt;
    host.device = BT_DEVICE_CPU; /* with opt->comm: this rank's shard */
    host.n_threads = 1;
    host.max_batch_tokens = 1;
    host.max_ctx = 1;
    host.max_batch_seqs = 1;
    bt_model_t *m;
    bt_status_t rc = load_cpu(dir, &host, &m, err, errlen, false);
    if (rc != BT_OK) return rc;
    m->opt = *opt;
    m->opt.engram_token_map = NULL; /* copied at load */
    if (m->opt.max_batch_tokens < 1) m->opt.max_batch_tokens = 1;
    if (m->opt.max_ctx < 1) m->opt.max_ctx = 1;
    if (m->opt.max_batch_seqs < 1) m->opt.max_batch_seqs = 1;
    rc = bt_model_cuda_attach(m, dir, err, errlen);
    if (rc != BT_OK) {
        bt_model_destroy(m);
        return rc;
    }
    *model_p = m;
    return BT_OK;
#else
    (void)model_p;
    snprintf(err, errlen, "%s: this build has no CUDA backend (configure with -DBT_CUDA=ON on a "
             "machine with the CUDA toolkit)", dir);
    return BT_ERR_UNSUPPORTED;
#endif
}

bt_status_t bt_model_load(const char *dir, const bt_model_options_t *opt, bt_model_t **model_p,
                          char *err, size_t errlen)
{
    if (opt && opt->device == BT_DEVICE_CUDA) return load_cuda(dir, opt, model_p, err, errlen);
    if (opt && opt->device != BT_DEVICE_CPU) {
        snprintf(err, errlen, "unknown device %d", opt->device);
        return BT_ERR_INVALID_ARG;
    }
    return load_cpu(dir, opt, model_p, err, errlen, true);
}

/* The CPU model; report: log its memory (not when it is only the device backend's loader). */
static bt_status_t load_cpu(const char *dir, const bt_model_options_t *opt, bt_model_t **model_p,
                            char *err, size_t errlen, bool report)
{
    bt_model_t *m = bt_calloc_or_die(1, sizeof *m);
    bt_safetensors_t *st = NULL;
    bt_status_t rc = bt_model_config_load(dir, &m->cfg, err, errlen);
    if (rc != BT_OK) goto fail;
    m->opt = opt ? *opt : bt_model_options_default();
    if (m->opt.max_batch_tokens < 1) m->opt.max_batch_tokens = 1;
    if (m->opt.max_ctx < 1) m->opt.max_ctx = 1;
    if (m->opt.max_batch_seqs < 1) m->opt.max_batch_seqs = 1;
    if (m->opt.draft && !m->cfg.n_draft) {
        snprintf(
            err, errlen,
            "%s: the checkpoint has no DSpark draft stages (config.json: num_nextn_predict_layers "
            "and dspark_block_size)",
            dir);
        rc = BT_ERR_BAD_CONFIG;
        goto fail;
    }
    if (!m->opt.draft) {
        /* the stages stay unloaded and the KV layout without their rings */
        m->cfg.n_draft = 0;
        m->cfg.draft_block = 0;
    }
    const bt_model_config_t *c = &m->cfg;
    if (c->n_draft && c->draft_active > MAX_ACTIVE) {
        snprintf(err, errlen, "%s/config.json: dspark_num_experts_per_tok %d exceeds %d", dir,
                 c->draft_active, MAX_ACTIVE);
        rc = BT_ERR_UNSUPPORTED;
        goto fail;
    }
    if (c->hc_mult > MAX_HC || c->hidden > BT_MAX_HIDDEN || c->n_active > MAX_ACTIVE ||
        c->head_dim > MAX_HEAD_DIM || c->rope_compress.rope_dim > 1024) {
        snprintf(err, errlen, "%s/config.json: a dimension exceeds what the CPU backend supports "
                 "(hc_mult <= %d, hidden <= %d, experts per token <= %d, head_dim <= %d)",
                 dir, MAX_HC, BT_MAX_HIDDEN, MAX_ACTIVE, MAX_HEAD_DIM);
        rc = BT_ERR_UNSUPPORTED;
        goto fail;
    }

    /* tensor-parallel partition */
    m->comm = m->opt.comm;
    m->tp_size = m->comm ? bt_comm_size(m->comm) : 1;
    m->tp_rank = m->comm ? bt_comm_rank(m->comm) : 0;
    {
        int T = m->tp_size, r = m->tp_rank;
        if (c->n_heads % T || c->moe_inter % T) {
            snprintf(err, errlen, "%s/config.json: TP %d must divide the attention heads (%d) and the expert width (%d)",
                     dir, T, c->n_heads, c->moe_inter);
            rc = BT_ERR_UNSUPPORTED;
            goto fail;
        }
        m->hl = c->n_heads / T;
        m->h0 = r * m->hl;
        /* output groups shard with their heads when they divide evenly; otherwise every rank
         * gathers all heads and applies wo_a and wo_b whole */
        m->group_split = c->o_groups % T == 0;
        m->gl = m->group_split ? c->o_groups / T : c->o_groups;
        m->g0 = m->group_split ? r * m->gl : 0;
        m->il = c->moe_inter / T;
        m->i0 = r * m->il;
        /* The activation quantization rounds each rank's slice of a row-parallel input (the
         * experts' hidden, wo_b's groups) in blocks of 32: the whole row's blocks only where
         * the slice holds whole blocks */
        int ko = c->o_groups * c->o_lora_rank;
        if (m->opt.activation_quant && T > 1 &&
            ((c->moe_inter % 32 == 0 && m->il % 32) ||
             (m->group_split && ko % 32 == 0 && (m->gl * c->o_lora_rank) % 32))) {
            snprintf(
                err, errlen,
                "%s: --activation-quant fp8 with TP %d: each rank's share of the expert width "
                "(%d) and of wo_b's input (%d) must be a multiple of 32, the quantizer's block",
                dir, T, m->il, m->group_split ? m->gl * c->o_lora_rank : ko);
            rc = BT_ERR_UNSUPPORTED;
            goto fail;
        }
        m->vpad = (c->vocab + T - 1) / T;
        m->v0 = r * m->vpad;
        m->vl = c->vocab - m->v0 < m->vpad ? c->vocab - m->v0 : m->vpad;
        if (m->vl < 0) m->vl = 0;
    }

    /* engram hash state: the token map comes from the tokenizer (common/text) */
    if (c->n_engram > 0) {
        if (!m->opt.engram_token_map) {
            snprintf(err, errlen, "%s: the model has engram layers; its tokenizer's token map is required", dir);
            rc = BT_ERR_INVALID_ARG;
            goto fail;
        }
        if (m->opt.engram_classes != c->engram_compressed_vocab) {
            snprintf(err, errlen,
                     "%s: the tokenizer-derived compressed vocabulary (%d classes) does not match "
                     "engram_compressed_vocab_size (%lld); the engram hashes would be garbage",
                     dir, m->opt.engram_classes, (long long)c->engram_compressed_vocab);
            rc = BT_ERR_BAD_CONFIG;
            goto fail;
        }
        m->token_map = track(m, bt_malloc_or_die((size_t)c->vocab * sizeof(int32_t)));
        memcpy(m->token_map, m->opt.engram_token_map, (size_t)c->vocab * sizeof(int32_t));
        m->opt.engram_token_map = NULL;
        if (c->engram_pad_id < 0 || c->engram_pad_id >= c->vocab) {
            snprintf(err, errlen, "%s/config.json: engram pad id %d outside the vocabulary", dir, c->engram_pad_id);
            rc = BT_ERR_BAD_CONFIG;
            goto fail;
        }
        m->pad_cid = m->token_map[c->engram_pad_id];
        int ng = c->engram_max_ngram - 1, nh = c->engram_heads;
        m->engram_cols = ng * nh;
        int layer_ids[BT_MAX_ENGRAM_LAYERS];
        for (int i = 0; i < c->n_engram; i++) layer_ids[i] = c->engram_layers[i];
        m->primes = track(m, bt_calloc_or_die((size_t)c->n_engram * (size_t)m->engram_cols, sizeof(int64_t)));
        m->offsets = track(m, bt_calloc_or_die((size_t)c->n_engram * (size_t)m->engram_cols, sizeof(int64_t)));
        m->multipliers = track(m, bt_calloc_or_die((size_t)c->n_engram * (size_t)c->engram_max_ngram, sizeof(int64_t)));
        rc = bt_engram_constants(layer_ids, c->n_engram, c->engram_max_ngram, nh, c->engram_vocab,
                                 c->engram_compressed_vocab, m->primes, m->offsets, m->multipliers);
        if (rc != BT_OK) {
            snprintf(err, errlen, "%s: cannot derive the engram hash constants", dir);
            goto fail;
        }
        for (int i = 0; i < c->n_engram; i++) {
            int64_t last = m->offsets[i * m->engram_cols + m->engram_cols - 1] +
                           m->primes[i * m->engram_cols + m->engram_cols - 1];
            if (last > c->engram_rows[i]) {
                snprintf(err, errlen, "%s/config.json: engram layer %d needs %lld table rows, engram_num_embeddings says %lld",
                         dir, c->engram_layers[i], (long long)last, (long long)c->engram_rows[i]);
                rc = BT_ERR_BAD_CONFIG;
                goto fail;
            }
        }
    }

    m->half_main = c->rope_main.rope_dim / 2;
    m->half_comp = c->rope_compress.rope_dim / 2;
    m->inv_freq_main = alloc_floats(m, (size_t)m->half_main);
    m->inv_freq_comp = alloc_floats(m, (size_t)m->half_comp);
    bt_rope_inv_freq(&c->rope_main, m->inv_freq_main);
    bt_rope_inv_freq(&c->rope_compress, m->inv_freq_comp);

    rc = bt_safetensors_open_dir(dir, &st, err, errlen);
    if (rc != BT_OK) goto fail;
    loader_t ld = {m, st, err, errlen, BT_OK};
    m->embed = load_rows(&ld, "embed.weight", c->vocab, c->hidden, m->v0, m->vl, NULL);
    m->head = load_rows(&ld, "head.weight", c->vocab, c->hidden, m->v0, m->vl, NULL);
    m->norm = load(&ld, "norm.weight", 1, c->hidden, 0, NULL);
    /* a progress line on a terminal: a real checkpoint takes minutes to read */
    bool show = isatty(STDERR_FILENO) && c->n_layers > 1;
    for (int l = 0; l < c->n_layers && ld.st_code == BT_OK; l++) {
        load_layer(&ld, l);
        if (show) fprintf(stderr, "\rloading %s: layer %d/%d", dir, l + 1, c->n_layers);
    }
    for (int j = 0; j < c->n_draft && ld.st_code == BT_OK; j++)
        load_layer(&ld, c->n_layers + j);
    for (int l = 0; l < BT_MAX_LAYERS; l++)
        m->target_slot[l] = -1;
    if (c->n_draft) {
        int D = c->hidden, T = c->n_draft_targets, R = c->draft_markov_rank;
        char last[32];
        snprintf(last, sizeof last, "mtp.%d", c->n_draft - 1);
        for (int k = 0; k < T; k++)
            m->target_slot[c->draft_targets[k]] = k;
        m->main_proj = load(&ld, "mtp.0.main_proj.weight", 2, D, (int64_t)T * D, NULL);
        m->main_proj_lowp = stored_lowp(&ld, "mtp.0.main_proj.weight");
        m->main_norm = load(&ld, "mtp.0.main_norm.weight", 1, D, 0, NULL);
        m->draft_norm = loadp(&ld, 1, D, 0, last, "norm.weight");
        m->markov_embed = loadp(&ld, 2, c->vocab, R, last, "markov_head.embed.weight");
        m->markov_head = loadp(&ld, 2, c->vocab, R, last, "markov_head.head.weight");
        m->conf_proj = loadp(&ld, 2, 1, (int64_t)D + R, last, "confidence_head.proj.weight");
    }
    if (show) fprintf(stderr, "\n");
    rc = ld.st_code;
    if (rc != BT_OK) goto fail;
    if (m->opt.activation_quant && m->tp_rank == 0) { /* what the switch does to this checkpoint */
        int n_lowp = m->main_proj_lowp;
        for (int l = 0; l < c->n_layers + c->n_draft; l++)
            n_lowp += __builtin_popcount(m->layer[l].lowp);
        if (n_lowp)
            BT_LOG_INFO("activation quantization: the inputs of %d linears (those stored FP8/FP4; "
                        "a layer's experts count as two) round to FP8 e4m3 per 32",
                        n_lowp);
        else
            BT_LOG_WARN("--activation-quant fp8: %s stores no linear in FP8 or FP4, so nothing "
                        "is rounded",
                        dir);
    }
    bt_safetensors_close(st);
    st = NULL;

    m->pool = bt_threads_create(m->opt.n_threads);
    size_t weights = m->host_bytes;
    alloc_scratch(m);
    if (report)
        BT_LOG_INFO("model %s on the CPU: weights %.1f MiB (f32), scratch %.1f MiB for %d tokens in <= %d "
                    "sequences; TP rank %d of %d", dir, (double)weights / (1 << 20),
                    (double)(m->host_bytes - weights) / (1 << 20), m->opt.max_batch_tokens, m->opt.max_batch_seqs,
                    m->tp_rank, m->tp_size);
    *model_p = m;
    return BT_OK;
fail:
    bt_safetensors_close(st);
    bt_model_destroy(m);
    return rc;
}

void bt_model_graph_stats(const bt_model_t *m, uint64_t *steps, uint64_t *instances)
{
    *steps = *instances = 0;
#ifdef BT_HAVE_CUDA_MODEL
    if (m->cuda) bt_model_cuda_graph_stats(m->cuda, steps, instances);
#endif
}

uint64_t bt_model_device_draws(const bt_model_t *m)
{
#ifdef BT_HAVE_CUDA_MODEL
    if (m->cuda) return bt_model_cuda_device_draws(m->cuda);
#endif
    return 0;
}

uint64_t bt_model_side_forks(const bt_model_t *m)
{
#ifdef BT_HAVE_CUDA_MODEL
    if (m->cuda) return bt_model_cuda_side_forks(m->cuda);
#endif
    return 0;
}

void bt_model_destroy(bt_model_t *m)
{
    if (!m) return;
#ifdef BT_HAVE_CUDA_MODEL
    bt_model_cuda_destroy(m->cuda);
#endif
    bt_threads_destroy(m->pool);
    free(m->draw_logits);
    bt_sampler_destroy(m->draw_sampler);
    for (int i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
    free(m->allocs);
    free(m);
}

/* ---- forward helpers --------------------------------------------------------------- */

typedef struct {
    bt_model_t *m;
    const bt_kv_layout_t *lay;
    const bt_forward_seq_t *seqs;
    int n_seqs, N, l;
    int seq_first[BT_MODEL_MAX_SEQS]; /* first token index of each sequence */
    bt_status_t comm_status; /* the first failed collective, BT_OK otherwise */
} fwd_t;

/* Records a collective's failure (a dead or stalled rank); the forward then stops. */
static bool tp_ok(fwd_t *f, bt_status_t st)
{
    if (st != BT_OK && f->comm_status == BT_OK) f->comm_status = st;
    return st == BT_OK;
}

/* Runs fn(f, token, task) for every token, tokens strided over tasks so that each task owns
 * one slice of per-task scratch. */
typedef void (*token_fn)(fwd_t *f, int token, int task);
typedef struct {
    fwd_t *f;
    token_fn fn;
    int tasks;
} strided_t;

static void strided_task(void *p, size_t task)
{
    strided_t *s = p;
    for (int t = (int)task; t < s->f->N; t += s->tasks) s->fn(s->f, t, (int)task);
}

/* x's rows as the input of a linear: with opt.activation_quant and the linear's weights stored
 * FP8/FP4 (lowp), a copy rounded as the reference deployment's kernels round activations (FP8
 * e4m3 with a UE8M0 scale per 32 values of a row; a row whose length is no multiple of 32 as it
 * is, as the reference's quantizers leave such shapes); else x itself */
static const float *aq_input(bt_model_t *m, const float *x, int rows, int K, bool lowp)
{
    if (!m->opt.activation_quant || !lowp || K % 32) return x;
    float *q = m->s.aq_rows;
    memcpy(q, x, (size_t)rows * (size_t)K * sizeof(float));
    for (int r = 0; r < rows; r++)
        bt_fake_quant_fp8_ue8m0(q + (size_t)r * K, K, 32);
    return q;
}

static void for_tokens(fwd_t *f, token_fn fn)
{
    int tasks = f->m->s.n_tasks < f->N ? f->m->s.n_tasks : f->N;
    strided_t s = {f, fn, tasks};
    bt_threads_for(tasks > 1 ? f->m->pool : NULL, (size_t)tasks, strided_task, &s);
}

static inline uint8_t *tok_state(fwd_t *f, int t)
{
    return f->seqs[f->m->s.tok_seq[t]].state;
}

/* One mHC mapping: (pre, post, comb) from the normalized flattened streams. */
static void hc_mix(const bt_model_config_t *c, const float *x, const float *fn, const float *base,
                   const float *scale, float *pre, float *post, float *comb)
{
    int hc = c->hc_mult, D = c->hidden, n = hc * D, mix = (2 + hc) * hc;
    float eps = (float)c->rms_eps, hc_eps = (float)c->hc_eps;
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    float m[MAX_MIX];
    for (int k = 0; k < mix; k++) {
        /* fn . (x * r), with x * r rounded per element as the reference does */
        const float *row = fn + (size_t)k * n;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += row[i + j] * (x[i + j] * r);
        for (int j = 0; i < n; i++, j++) acc[j] += row[i] * (x[i] * r);
        m[k] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    for (int k = 0; k < hc; k++) {
        pre[k] = bt_sigmoidf(m[k] * scale[0] + base[k]) + hc_eps;
        post[k] = 2.0f * bt_sigmoidf(m[hc + k] * scale[1] + base[hc + k]);
    }
    /* comb[j][k]: softmax over k, then Sinkhorn: columns, then (rows, columns) x (iters-1) */
    for (int j = 0; j < hc; j++) {
        float *row = comb + j * hc;
        float mx = -INFINITY;
        for (int k = 0; k < hc; k++) {
            row[k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
            mx = fmaxf(mx, row[k]);
        }
        float sum = 0.0f;
        for (int k = 0; k < hc; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
        for (int k = 0; k < hc; k++) row[k] = row[k] / sum + hc_eps;
    }
    for (int it = 0; it < c->sinkhorn_iters; it++) {
        if (it > 0) {
            for (int j = 0; j < hc; j++) {
                float sum = 0.0f;
                for (int k = 0; k < hc; k++) sum += comb[j * hc + k];
                for (int k = 0; k < hc; k++) comb[j * hc + k] /= sum + hc_eps;
            }
        }
        for (int k = 0; k < hc; k++) {
            float sum = 0.0f;
            for (int j = 0; j < hc; j++) sum += comb[j * hc + k];
            for (int j = 0; j < hc; j++) comb[j * hc + k] /= sum + hc_eps;
        }
    }
}

/* out = sum_s w_s X_s, or the streams' mean when w is NULL */
static void hc_collapse(const bt_model_config_t *c, const float *x, const float *w, float *out)
{
    int hc = c->hc_mult, D = c->hidden;
    for (int d = 0; d < D; d++) {
        float acc = 0.0f;
        for (int s = 0; s < hc; s++)
            acc += w ? w[s] * x[s * D + d] : x[s * D + d];
        out[d] = w ? acc : acc / (float)hc;
    }
}

/* hc_collapse, then RMSNorm with weight */
static void hc_collapse_norm(const bt_model_config_t *c, const float *x, const float *w,
                             const float *norm_w, float *out)
{
    hc_collapse(c, x, w, out);
    bt_cpu_rmsnorm(out, out, norm_w, c->hidden, (float)c->rms_eps);
}

/* X_k <- post_k * o + sum_j comb[j][k] X_j */
static void hc_expand(const bt_model_config_t *c, float *x, const float *o, const float *post,
                      const float *comb)
{
    int hc = c->hc_mult, D = c->hidden;
    float res[MAX_HC];
    for (int d = 0; d < D; d++) {
        for (int j = 0; j < hc; j++) res[j] = x[j * D + d];
        for (int k = 0; k < hc; k++) {
            float acc = 0.0f;
            for (int j = 0; j < hc; j++) acc += comb[j * hc + k] * res[j];
            x[k * D + d] = post[k] * o[d] + acc;
        }
    }
}

/* Keeps the k best (score, lower index wins ties) of a stream; heap of the current worst. */
typedef struct {
    float *score;
    int32_t *idx;
    int n, k;
} topk_t;

static inline int worse(const topk_t *h, int a, int b) /* is a worse than b */
{
    if (h->score[a] != h->score[b]) return h->score[a] < h->score[b];
    return h->idx[a] > h->idx[b];
}

static void heap_sift_down(topk_t *h, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < h->n && worse(h, l, w)) w = l;
        if (r < h->n && worse(h, r, w)) w = r;
        if (w == i) return;
        float ts = h->score[i];
        int32_t ti = h->idx[i];
        h->score[i] = h->score[w];
        h->idx[i] = h->idx[w];
        h->score[w] = ts;
        h->idx[w] = ti;
        i = w;
    }
}

static void topk_push(topk_t *h, float score, int32_t idx)
{
    if (h->n < h->k) {
        int i = h->n++;
        h->score[i] = score;
        h->idx[i] = idx;
        while (i > 0) {
            int p = (i - 1) / 2;
            if (!worse(h, i, p)) break;
            float ts = h->score[i];
            int32_t ti = h->idx[i];
            h->score[i] = h->score[p];
            h->idx[i] = h->idx[p];
            h->score[p] = ts;
            h->idx[p] = ti;
            i = p;
        }
        return;
    }
    /* indices arrive in increasing order, so an equal score never displaces */
    if (score > h->score[0]) {
        h->score[0] = score;
        h->idx[0] = idx;
        heap_sift_down(h, 0);
    }
}

/* In-place heapsort: qsort may allocate, and a decode step must not. */
static void sort_i32(int32_t *v, int n)
{
    for (int start = n / 2 - 1, end = n;; ) {
        int root;
        if (start >= 0) {
            root = start--;
        } else {
            if (--end <= 0) return;
            int32_t t = v[0];
            v[0] = v[end];
            v[end] = t;
            root = 0;
        }
        for (;;) {
            int child = 2 * root + 1;
            if (child >= end) break;
            if (child + 1 < end && v[child + 1] > v[child]) child++;
            if (v[root] >= v[child]) break;
            int32_t t = v[root];
            v[root] = v[child];
            v[child] = t;
            root = child;
        }
    }
}

/* Writes the selected indices whose score is finite, ascending; returns their count. */
static int topk_finish(topk_t *h, int32_t *out)
{
    int n = 0;
    for (int i = 0; i < h->n; i++)
        if (h->score[i] > -INFINITY) out[n++] = h->idx[i];
    sort_i32(out, n);
    return n;
}

/* ---- engram -------------------------------------------------------------------------- */

/* Compressed ids and hash ids of every token (sequentially per sequence: cheap). */
void bt_model__engram_hashes(const bt_model_t *m, const bt_forward_seq_t *seqs, int n_seqs,
                             const int *seq_first, int64_t *cid, int64_t *hash)
{
    const bt_model_config_t *c = &m->cfg;
    int ng = c->engram_max_ngram, cols = m->engram_cols, nh = c->engram_heads;
    for (int q = 0; q < n_seqs; q++) {
        const bt_forward_seq_t *seq = &seqs[q];
        bt_kv_header_t *h = bt_kv_header(seq->state);
        int first = seq_first[q];
        int64_t start = h->n_tokens;
        for (int i = 0; i < seq->n; i++) cid[first + i] = m->token_map[seq->ids[i]];
        for (int i = 0; i < seq->n; i++) {
            int64_t pos = start + i;
            int64_t tokens[8];
            for (int k = 0; k < ng; k++) {
                int64_t p = pos - k;
                if (p < 0)
                    tokens[k] = m->pad_cid; /* before the start: the pad class, and stays blocked */
                else if (p >= start)
                    tokens[k] = cid[first + (p - start)];
                else
                    tokens[k] = h->engram_hist[p % BT_KV_ENGRAM_HISTORY];
            }
            for (int e = 0; e < c->n_engram; e++) {
                const int64_t *mult = m->multipliers + (size_t)e * ng;
                const int64_t *primes = m->primes + (size_t)e * cols;
                const int64_t *offs = m->offsets + (size_t)e * cols;
                int64_t *out = hash + ((size_t)(first + i) * c->n_engram + e) * cols;
                uint64_t rolling = (uint64_t)(tokens[0] * mult[0]);
                for (int k = 1; k < ng; k++) {
                    rolling ^= (uint64_t)(tokens[k] * mult[k]);
                    for (int hh = 0; hh < nh; hh++) {
                        int col = (k - 1) * nh + hh;
                        out[col] = (int64_t)(rolling % (uint64_t)primes[col]) + offs[col];
                    }
                }
            }
        }
    }
}

static void engram_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    int ei = c->layer[f->l].engram_index;
    int cols = m->engram_cols, ehd = c->engram_head_dim, hc = c->hc_mult, D = c->hidden;
    float *e = m->s.task_engram + (size_t)task * ((size_t)cols * ehd + (size_t)(hc + 1) * D);
    float *kv = e + (size_t)cols * ehd;
    const int64_t *ids = m->s.hash + ((size_t)t * c->n_engram + ei) * cols;
    for (int j = 0; j < cols; j++)
        memcpy(e + (size_t)j * ehd, w->e_embed + (size_t)ids[j] * ehd, (size_t)ehd * sizeof(float));
    if (m->opt.activation_quant && (w->lowp & AQ_E_WKV)) bt_fake_quant_fp8_ue8m0(e, cols * ehd, 32);
    for (int o = 0; o < (hc + 1) * D; o++)
        kv[o] = bt_cpu_dot(w->e_wkv + (size_t)o * cols * ehd, e, cols * ehd);
    const float *value = kv + (size_t)hc * D;
    float *x = m->s.x + (size_t)t * hc * D;
    float eps = (float)c->rms_eps;
    for (int s = 0; s < hc; s++) {
        float *h = x + (size_t)s * D;
        const float *key = kv + (size_t)s * D;
        const float *qk = w->e_qk + (size_t)s * D;
        float hh = 0.0f, kk = 0.0f, dot = 0.0f;
        for (int d = 0; d < D; d++) {
            hh += h[d] * h[d];
            kk += key[d] * key[d];
            dot += (h[d] * qk[d]) * key[d];
        }
        float rstd = (1.0f / sqrtf(hh / (float)D + eps)) * (1.0f / sqrtf(kk / (float)D + eps));
        dot = dot * rstd * (1.0f / sqrtf((float)D));
        float g = bt_sigmoidf(copysignf(sqrtf(fmaxf(fabsf(dot), 1e-6f)), dot));
        for (int d = 0; d < D; d++) h[d] = h[d] + g * value[d];
    }
}

/* ---- attention ----------------------------------------------------------------------- */

/* One mHC site of a layer: its (pre, post, comb) mapping from the streams, and the sublayer
 * input, which collapses the streams with the previous site's pre (carried in collapse_w). */
static void site_mix(fwd_t *f, int t, const float *fn, const float *base, const float *scale,
                     float *pre_out, const float *collapse_w, const float *norm_w)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int hc = c->hc_mult, D = c->hidden;
    const float *x = s->x + (size_t)t * hc * D;
    hc_mix(c, x, fn, base, scale, pre_out + t * hc, s->post + t * hc, s->comb + (size_t)t * hc * hc);
    hc_collapse_norm(c, x, collapse_w + t * hc, norm_w, s->xin + (size_t)t * D);
}

static void attn_mix_token(fwd_t *f, int t, int task)
{
    const layer_weights_t *w = &f->m->layer[f->l];
    scratch_t *s = &f->m->s;
    site_mix(f, t, w->hc_attn_fn, w->hc_attn_base, w->hc_attn_scale, s->attn_pre, s->pre_mix, w->attn_norm);
}

static void ffn_mix_token(fwd_t *f, int t, int task)
{
    const layer_weights_t *w = &f->m->layer[f->l];
    scratch_t *s = &f->m->s;
    /* the FFN collapses with the attention site's pre; its own pre goes to the next layer */
    site_mix(f, t, w->hc_ffn_fn, w->hc_ffn_base, w->hc_ffn_scale, s->pre_mix, s->attn_pre, w->ffn_norm);
}

static void expand_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int hc = c->hc_mult, D = c->hidden;
    hc_expand(c, s->x + (size_t)t * hc * D, s->out + (size_t)t * D, s->post + t * hc,
              s->comb + (size_t)t * hc * hc);
}

/* q_norm, rope on q and kv, kv_norm, FP8 rounding of the window KV */
static void qkv_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    scratch_t *s = &m->s;
    int hd = c->head_dim;
    bool comp = c->layer[f->l].compress_ratio > 0;
    int half = comp ? m->half_comp : m->half_main;
    const float *cs = (comp ? s->cos_comp : s->cos_main) + (size_t)t * half;
    const float *sn = (comp ? s->sin_comp : s->sin_main) + (size_t)t * half;
    float *q = s->q + (size_t)t * m->hl * hd;
    for (int h = 0; h < m->hl; h++) bt_cpu_rope(q + (size_t)h * hd, hd, cs, sn, half, 0);
    float *kv = s->kv + (size_t)t * hd;
    bt_cpu_rmsnorm(kv, kv, w->kv_norm, hd, (float)c->rms_eps);
    bt_cpu_rope(kv, hd, cs, sn, half, 0);
    bt_fake_quant_fp8_ue8m0(kv, hd, 32);
}

static void q_norm_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    float *qr = m->s.q_res + (size_t)t * c->q_lora_rank;
    bt_cpu_rmsnorm(qr, qr, m->layer[f->l].q_norm, c->q_lora_rank, (float)c->rms_eps);
}

/* ---- speculative verification's undo record ----------------------------------------------- */

void bt_model__undo_record(const bt_model_t *m, const bt_kv_layout_t *lay,
                           const bt_forward_seq_t *seq)
{
    const bt_model_config_t *c = &m->cfg;
    bt_kv_undo_t *u = seq->undo;
    size_t hd = (size_t)c->head_dim;
    const bt_kv_header_t *h = bt_kv_header(seq->state);
    u->before = *h;
    u->n = seq->n;
    for (int l = 0; l < lay->n_rings; l++) {
        const float *ring = bt_kv_region(seq->state, lay->window_off[l]);
        for (int i = 0; i < seq->n; i++)
            memcpy(u->ring + ((size_t)l * u->max_rows + i) * hd,
                   ring + (size_t)((h->n_tokens + i) % c->window) * hd, hd * sizeof(float));
    }
    for (int l = 0; l < c->n_layers; l++) {
        if (!u->pend_kv[l]) continue;
        size_t r = (size_t)c->layer[l].compress_ratio;
        memcpy(u->pend_kv[l], bt_kv_region(seq->state, lay->pend_kv_off[l]),
               r * hd * sizeof(float));
        if (u->pend_gate[l])
            memcpy(u->pend_gate[l], bt_kv_region(seq->state, lay->pend_gate_off[l]),
                   r * hd * sizeof(float));
    }
}

static void undo_row(bt_kv_undo_t *u, int l, int i, const float *kv, const float *gate, int hd)
{
    memcpy(u->row_kv[l] + (size_t)i * hd, kv, (size_t)hd * sizeof(float));
    if (gate) memcpy(u->row_gate[l] + (size_t)i * hd, gate, (size_t)hd * sizeof(float));
}

/* Closes one compressor group into entry e: the pre-rope latent gives the index key (on
 * key owners), the rotated and FP4-rounded latent is the attention entry. */
static void emit_entry(bt_model_t *m, int l, uint8_t *state, const bt_kv_layout_t *lay,
                       float *latent, int64_t e)
{
    const bt_model_config_t *c = &m->cfg;
    const bt_layer_config_t *L = &c->layer[l];
    const layer_weights_t *w = &m->layer[l];
    int hd = c->head_dim, ihd = c->index_head_dim, half = m->half_comp;
    float cs[512], sn[512];
    bt_cpu_rmsnorm(latent, latent, w->c_norm, hd, (float)c->rms_eps);
    bt_cpu_rope_angles(cs, sn, m->inv_freq_comp, half, e * L->compress_ratio);
    if (L->is_index_source) {
        float *k = bt_kv_region(state, lay->ikey_off[l]) + (size_t)e * ihd;
        float lq[MAX_HEAD_DIM]; /* the latent as wk's input (activation_quant) */
        const float *kin = latent;
        if (m->opt.activation_quant && (w->lowp & AQ_I_WK)) {
            memcpy(lq, latent, (size_t)hd * sizeof(float));
            bt_fake_quant_fp8_ue8m0(lq, hd, 32);
            kin = lq;
        }
        for (int o = 0; o < ihd; o++)
            k[o] = bt_cpu_dot(w->i_wk + (size_t)o * hd, kin, hd);
        bt_cpu_rmsnorm(k, k, w->i_k_norm, ihd, (float)c->rms_eps);
        bt_cpu_rope(k, ihd, cs, sn, half, 0);
        bt_fake_quant_fp4_ue8m0(k, ihd, 32);
    }
    float *dst = bt_kv_region(state, lay->comp_off[l]) + (size_t)e * hd;
    memcpy(dst, latent, (size_t)hd * sizeof(float));
    bt_cpu_rope(dst, hd, cs, sn, half, 0);
    bt_fake_quant_fp4_e4m3(dst, hd, 16);
}

/* The compressor of a kv-source layer, sequence by sequence in token order. */
static void compress_seq(void *p, size_t q)
{
    fwd_t *f = p;
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    int l = f->l, hd = c->head_dim, r = c->layer[l].compress_ratio;
    const bt_forward_seq_t *seq = &f->seqs[q];
    bt_kv_header_t *h = bt_kv_header(seq->state);
    float *pkv = bt_kv_region(seq->state, f->lay->pend_kv_off[l]);
    float *pgate = bt_kv_region(seq->state, f->lay->pend_gate_off[l]);
    float latent[MAX_HEAD_DIM];
    for (int i = 0; i < seq->n; i++) {
        int t = f->seq_first[q] + i;
        int64_t p = h->pending[l];
        memcpy(pkv + p * hd, m->s.ckv + (size_t)t * hd, (size_t)hd * sizeof(float));
        if (r > 1) memcpy(pgate + p * hd, m->s.cgate + (size_t)t * hd, (size_t)hd * sizeof(float));
        if (seq->undo)
            undo_row(seq->undo, l, i, m->s.ckv + (size_t)t * hd,
                     r > 1 ? m->s.cgate + (size_t)t * hd : NULL, hd);
        if (++p < r) {
            h->pending[l] = p;
            continue;
        }
        h->pending[l] = 0;
        if (r == 1) {
            memcpy(latent, pkv, (size_t)hd * sizeof(float));
        } else {
            /* softmax over the group's tokens, per channel, then the weighted sum */
            for (int d = 0; d < hd; d++) {
                float mx = -INFINITY;
                for (int j = 0; j < r; j++) mx = fmaxf(mx, pgate[j * hd + d]);
                float ex[16], sum = 0.0f;
                for (int j = 0; j < r; j++) {
                    ex[j] = expf(pgate[j * hd + d] - mx);
                    sum += ex[j];
                }
                float acc = 0.0f;
                for (int j = 0; j < r; j++) acc += pkv[j * hd + d] * (ex[j] / sum);
                latent[d] = acc;
            }
        }
        emit_entry(m, l, seq->state, f->lay, latent, h->entries[l]);
        h->entries[l]++;
    }
}

static void index_q_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    int ihd = c->index_head_dim, half = m->half_comp;
    float *q = m->s.qi + (size_t)t * c->index_heads * ihd;
    const float *cs = m->s.cos_comp + (size_t)t * half, *sn = m->s.sin_comp + (size_t)t * half;
    for (int h = 0; h < c->index_heads; h++) {
        bt_cpu_rope(q + (size_t)h * ihd, ihd, cs, sn, half, 0);
        bt_fake_quant_fp4_ue8m0(q + (size_t)h * ihd, ihd, 32);
    }
    float scale = 1.0f / sqrtf((float)c->index_heads);
    float *w = m->s.iw + (size_t)t * c->index_heads;
    for (int h = 0; h < c->index_heads; h++) w[h] *= scale;
}

/* Scores one query against the owner's index keys, applies visibility, the candidate
 * blocks (two-level top-k) and keeps the top index_topk entries. */
static void index_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int l = f->l;
    const bt_layer_config_t *L = &c->layer[l];
    int owner = L->index_key_owner;
    uint8_t *state = tok_state(f, t);
    int64_t n_entries = bt_kv_header(state)->entries[owner];
    if (n_entries == 0) return; /* the reference returns early and publishes nothing */
    int ihd = c->index_head_dim, ih = c->index_heads;
    const float *keys = bt_kv_region(state, f->lay->ikey_off[owner]);
    const float *q = s->qi + (size_t)t * ih * ihd;
    const float *w = s->iw + (size_t)t * ih;
    float softmax_scale = 1.0f / sqrtf((float)ihd);
    int64_t visible = (s->tok_pos[t] + 1) / L->compress_ratio;
    size_t per_scores = (size_t)m->opt.max_ctx;
    size_t nblk_cap = per_scores / (size_t)c->candidate_block_size + 1;
    if (nblk_cap > per_scores) per_scores = nblk_cap;
    float *scores = s->task_scores + (size_t)task * (per_scores + 1);

    bool use_cand = c->candidate_source >= 0 && c->candidate_source < l && s->cand_set[t];
    int bs = c->candidate_block_size;
    const int32_t *cand = s->cand + (size_t)t * (c->candidate_topk_blocks > 0 ? c->candidate_topk_blocks : 1);
    int ci = 0;
    for (int64_t j = 0; j < n_entries; j++) {
        if (j >= visible) {
            scores[j] = -INFINITY;
            continue;
        }
        if (use_cand) {
            int64_t blk = j / bs;
            while (ci < s->cand_n[t] && cand[ci] < blk) ci++;
            if (ci >= s->cand_n[t] || cand[ci] != blk) {
                scores[j] = -INFINITY;
                continue;
            }
        }
        const float *k = keys + (size_t)j * ihd;
        float acc = 0.0f;
        for (int h = 0; h < ih; h++) {
            float d = bt_cpu_dot(q + (size_t)h * ihd, k, ihd);
            acc += (fmaxf(d, 0.0f) * softmax_scale) * w[h];
        }
        scores[j] = acc;
    }
    size_t heap = m->heap_len;
    topk_t hp = {s->task_bscore + (size_t)task * heap, s->task_idx + (size_t)task * heap, 0, 0};

    if (l == c->candidate_source) {
        /* level one: block maxima, the block of the newest visible entry pinned */
        int64_t nblocks = (n_entries + bs - 1) / bs;
        int64_t last = visible > 0 ? (visible - 1) / bs : -1;
        hp.k = (int)(c->candidate_topk_blocks < nblocks ? c->candidate_topk_blocks : nblocks);
        for (int64_t b = 0; b < nblocks; b++) {
            float mx = -INFINITY;
            for (int64_t j = b * bs; j < (b + 1) * bs && j < n_entries; j++) mx = fmaxf(mx, scores[j]);
            if (b == last) mx = INFINITY;
            topk_push(&hp, mx, (int32_t)b);
        }
        int32_t *out = s->cand + (size_t)t * c->candidate_topk_blocks;
        s->cand_n[t] = topk_finish(&hp, out);
        s->cand_set[t] = 1;
        hp.n = 0;
    }
    hp.k = (int)(c->index_topk < n_entries ? c->index_topk : n_entries);
    for (int64_t j = 0; j < n_entries; j++) topk_push(&hp, scores[j], (int32_t)j);
    s->topk_n[t] = topk_finish(&hp, s->topk + (size_t)t * c->index_topk);
    s->topk_set[t] = 1;
}

/* One head's attention: o = sum_j softmax_j(q . keys[j] * scale, with the sink) keys[j], the
 * sink only growing the denominator; p: scratch for n scores. */
static void attend_head(const float *q, const float *const *keys, int n, float sink, float scale,
                        int hd, float *p, float *o)
{
    float mx = sink;
    for (int j = 0; j < n; j++) {
        p[j] = bt_cpu_dot(q, keys[j], hd) * scale;
        mx = fmaxf(mx, p[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    sum += expf(sink - mx);
    for (int d = 0; d < hd; d++)
        o[d] = 0.0f;
    for (int j = 0; j < n; j++) {
        float pj = p[j] / sum;
        const float *k = keys[j];
        for (int d = 0; d < hd; d++)
            o[d] += pj * k[d];
    }
}

static void attend_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    const bt_layer_config_t *L = &c->layer[f->l];
    scratch_t *s = &m->s;
    int hd = c->head_dim, H = m->hl, W = c->window;
    int q_seq = s->tok_seq[t];
    uint8_t *state = f->seqs[q_seq].state;
    int64_t start = bt_kv_header(state)->n_tokens; /* position of the chunk's first token */
    int first = f->seq_first[q_seq];
    int64_t pos = s->tok_pos[t];
    int64_t lo = pos - W + 1 > 0 ? pos - W + 1 : 0;
    const float *ring = bt_kv_region(state, f->lay->window_off[f->l]);

    /* the window's keys (this chunk's own rows, older ones from the ring), then the compressed
     * entries it attends: the published top-k of the latest index source, over the latest kv
     * source's cache */
    const float **keys = s->task_keys + (size_t)task * s->probs_stride;
    int n = 0;
    for (int64_t kp = lo; kp <= pos; kp++)
        keys[n++] = kp >= start ? s->kv + (size_t)(first + (kp - start)) * hd
                                : ring + (size_t)(kp % W) * hd;
    if (L->compress_ratio && L->kv_source >= 0 && s->topk_set[t]) {
        int64_t n_entries = bt_kv_header(state)->entries[L->kv_source];
        const float *comp = bt_kv_region(state, f->lay->comp_off[L->kv_source]);
        const int32_t *sel = s->topk + (size_t)t * c->index_topk;
        int n_sel = s->topk_n[t];
        while (n_sel > 0 && sel[n_sel - 1] >= n_entries) n_sel--;
        for (int j = 0; j < n_sel; j++)
            keys[n++] = comp + (size_t)sel[j] * hd;
    }
    float *p = s->probs + (size_t)t * s->probs_stride;
    float scale = 1.0f / sqrtf((float)hd);
    bool compl = L->compress_ratio > 0;
    int half = compl ? m->half_comp : m->half_main;
    const float *cs = (compl ? s->cos_comp : s->cos_main) + (size_t)t * half;
    const float *sn = (compl ? s->sin_comp : s->sin_main) + (size_t)t * half;
    for (int h = 0; h < H; h++) {
        float *o = s->attn + ((size_t)t * H + h) * hd;
        attend_head(s->q + ((size_t)t * H + h) * hd, keys, n, w->attn_sink[h], scale, hd, p, o);
        bt_cpu_rope(o, hd, cs, sn, half, 1);
    }
}

/* grouped low-rank output: wo_a per group (this rank's groups, or all of them over the
 * gathered heads) */
static void woa_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    scratch_t *s = &m->s;
    int hd = c->head_dim, R = c->o_lora_rank, gin = c->n_heads * hd / c->o_groups, G = m->gl;
    const float *a = s->attn + (size_t)t * G * gin;
    float *oa = s->oa + (size_t)t * G * R;
    for (int g = 0; g < G; g++)
        for (int r = 0; r < R; r++)
            oa[g * R + r] = bt_cpu_dot(w->wo_a + ((size_t)g * R + r) * gin, a + (size_t)g * gin, gin);
}

/* The heads' outputs in s->attn through wo_a (per group) and wo_b into s->out, with the
 * collectives TP needs; false when one failed. */
static bool attention_out(fwd_t *f)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    scratch_t *s = &m->s;
    int N = f->N, D = c->hidden, hd = c->head_dim;
    if (m->tp_size > 1 && !m->group_split) {
        /* every rank needs every head before the whole wo_a: gather [rank][token][head] */
        size_t per = (size_t)m->hl * hd;
        if (!tp_ok(f, bt_comm_all_gather(m->comm, s->attn, (size_t)N * per * sizeof(float),
                                         m->gather)))
            return false;
        for (int t = 0; t < N; t++)
            for (int r = 0; r < m->tp_size; r++)
                memcpy(s->attn + ((size_t)t * m->tp_size + r) * per,
                       m->gather + ((size_t)r * N + t) * per, per * sizeof(float));
    }
    for_tokens(f, woa_token);
    int ko = m->gl * c->o_lora_rank;
    bt_cpu_matmul(m->pool, s->out, aq_input(m, s->oa, N, ko, w->lowp & AQ_WO_B), w->wo_b, N, D, ko);
    return !(m->tp_size > 1 && m->group_split &&
             !tp_ok(f, bt_comm_all_reduce_f32(m->comm, s->out, (size_t)N * D)));
}

/* The sublayer input's queries (this rank's heads) and its window KV row, normed, rotated and
 * rounded (qkv_token). */
static void qkv_project(fwd_t *f)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    scratch_t *s = &m->s;
    int N = f->N, D = c->hidden, hd = c->head_dim;
    bt_cpu_matmul(m->pool, s->q_res, aq_input(m, s->xin, N, D, w->lowp & AQ_WQ_A), w->wq_a, N,
                  c->q_lora_rank, D);
    for_tokens(f, q_norm_token);
    bt_cpu_matmul(m->pool, s->q, aq_input(m, s->q_res, N, c->q_lora_rank, w->lowp & AQ_WQ_B),
                  w->wq_b, N, m->hl * hd, c->q_lora_rank);
    bt_cpu_matmul(m->pool, s->kv, aq_input(m, s->xin, N, D, w->lowp & AQ_WKV), w->wkv, N, hd, D);
    for_tokens(f, qkv_token);
}

static void attention(fwd_t *f)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    const bt_layer_config_t *L = &c->layer[f->l];
    scratch_t *s = &m->s;
    int N = f->N, D = c->hidden, hd = c->head_dim;

    qkv_project(f);
    if (L->compress_ratio) {
        if (L->is_kv_source) {
            bt_cpu_matmul(m->pool, s->ckv, aq_input(m, s->xin, N, D, w->lowp & AQ_C_WKV), w->c_wkv,
                          N, hd, D);
            if (w->c_wgate)
                bt_cpu_matmul(m->pool, s->cgate, aq_input(m, s->xin, N, D, w->lowp & AQ_C_WGATE),
                              w->c_wgate, N, hd, D);
            bt_threads_for(f->n_seqs > 1 ? m->pool : NULL, (size_t)f->n_seqs, compress_seq, f);
        }
        if (L->is_index_source && L->index_key_owner >= 0) {
            bt_cpu_matmul(m->pool, s->qi,
                          aq_input(m, s->q_res, N, c->q_lora_rank, w->lowp & AQ_I_WQ_B), w->i_wq_b,
                          N, c->index_heads * c->index_head_dim, c->q_lora_rank);
            bt_cpu_matmul(m->pool, s->iw, aq_input(m, s->xin, N, D, w->lowp & AQ_I_WPROJ),
                          w->i_weights_proj, N, c->index_heads, D);
            for_tokens(f, index_q_token);
            for_tokens(f, index_token);
        }
    }
    for_tokens(f, attend_token);
    if (!attention_out(f)) return;

    /* the window rings take the chunk's KV only now: earlier queries read older slots */
    for (int q = 0; q < f->n_seqs; q++) {
        const bt_forward_seq_t *seq = &f->seqs[q];
        int64_t start = bt_kv_header(seq->state)->n_tokens;
        float *ring = bt_kv_region(seq->state, f->lay->window_off[f->l]);
        int from = seq->n > c->window ? seq->n - c->window : 0;
        for (int i = from; i < seq->n; i++)
            memcpy(ring + (size_t)((start + i) % c->window) * hd,
                   s->kv + (size_t)(f->seq_first[q] + i) * hd, (size_t)hd * sizeof(float));
    }
}

/* ---- MoE ----------------------------------------------------------------------------- */

/* quant_h: w2's input rounded as the activation quantization rounds (x comes rounded) */
static void expert(const float *x, const float *w1, const float *w2, const float *w3, int D, int I,
                   float limit, float weight, bool weighted, bool quant_h, float *hbuf, float *acc)
{
    for (int i = 0; i < I; i++) {
        float g = bt_cpu_dot(w1 + (size_t)i * D, x, D);
        float u = bt_cpu_dot(w3 + (size_t)i * D, x, D);
        if (limit > 0) {
            u = fminf(fmaxf(u, -limit), limit);
            g = fminf(g, limit);
        }
        float y = bt_siluf(g) * u;
        hbuf[i] = weighted ? weight * y : y;
    }
    if (quant_h) bt_fake_quant_fp8_ue8m0(hbuf, I, 32);
    for (int d = 0; d < D; d++) acc[d] += bt_cpu_dot(w2 + (size_t)d * I, hbuf, I);
}

static void moe_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    scratch_t *s = &m->s;
    int D = c->hidden, I = m->il, E = w->n_experts, K = w->n_active;
    float *buf = s->task_moe + (size_t)task * m->moe_task_floats;
    float *hbuf = buf, *scores = buf + 2 * I, *acc = scores + E, *xq = acc + D;
    const float *x = s->xin + (size_t)t * D;
    /* the activation quantization's inputs: x rounded for the experts stored FP8/FP4 */
    bool aq = m->opt.activation_quant;
    if (aq && (w->lowp & (AQ_W13 | AQ_SHARED13))) {
        memcpy(xq, x, (size_t)D * sizeof(float));
        bt_fake_quant_fp8_ue8m0(xq, D, 32);
    }

    size_t heap = m->heap_len;
    topk_t hp = {s->task_bscore + (size_t)task * heap, s->task_idx + (size_t)task * heap, 0, K};
    for (int e = 0; e < E; e++) {
        float logit = bt_cpu_dot(w->gate_w + (size_t)e * D, x, D) / (float)c->gate_temp;
        scores[e] = sqrtf(bt_softplusf(logit));
        topk_push(&hp, scores[e] + w->gate_bias[e], e); /* the bias steers selection only */
    }
    /* selection in descending biased order, as topk returns it */
    int32_t sel[MAX_ACTIVE];
    float sb[MAX_ACTIVE];
    int n = hp.n;
    for (int i = 0; i < n; i++) {
        sel[i] = hp.idx[i];
        sb[i] = hp.score[i];
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && (sb[j] > sb[j - 1] || (sb[j] == sb[j - 1] && sel[j] < sel[j - 1])); j--) {
            float ts = sb[j];
            sb[j] = sb[j - 1];
            sb[j - 1] = ts;
            int32_t ti = sel[j];
            sel[j] = sel[j - 1];
            sel[j - 1] = ti;
        }
    float wts[MAX_ACTIVE], sum = 0.0f;
    for (int i = 0; i < n; i++) {
        wts[i] = scores[sel[i]];
        sum += wts[i];
    }
    for (int i = 0; i < n; i++) {
        if (c->norm_topk_prob && K > 1) wts[i] = wts[i] / (sum + 1e-20f);
        wts[i] *= (float)c->route_scale;
    }
    for (int d = 0; d < D; d++) acc[d] = 0.0f;
    float limit = (float)c->swiglu_limit;
    /* routed experts summed in expert order, then the shared expert (no weight) */
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < n; i++) {
            if (sel[i] != e) continue;
            size_t off = (size_t)e * I * D;
            expert(aq && (w->lowp & AQ_W13) ? xq : x, w->w1 + off, w->w2 + off, w->w3 + off, D, I,
                   limit, wts[i], true, aq && (w->lowp & AQ_W2), hbuf, acc);
        }
    }
    float *out = s->out + (size_t)t * D;
    if (w->sw1) {
        float sh[BT_MAX_HIDDEN];
        for (int d = 0; d < D; d++) sh[d] = 0.0f;
        expert(aq && (w->lowp & AQ_SHARED13) ? xq : x, w->sw1, w->sw2, w->sw3, D, I, limit, 1.0f,
               false, aq && (w->lowp & AQ_SHARED2), hbuf, sh);
        for (int d = 0; d < D; d++) out[d] = acc[d] + sh[d];
    } else {
        for (int d = 0; d < D; d++) out[d] = acc[d];
    }
}

/* The FFN site: its mix, the MoE into s->out, summed over the ranks (each computed its slice
 * of every expert's width); false when the sum failed. */
static bool moe_sublayer(fwd_t *f)
{
    bt_model_t *m = f->m;
    for_tokens(f, ffn_mix_token);
    for_tokens(f, moe_token);
    return !(m->tp_size > 1 &&
             !tp_ok(f, bt_comm_all_reduce_f32(m->comm, m->s.out, (size_t)f->N * m->cfg.hidden)));
}

/* ---- DSpark: the target's side ------------------------------------------------------------ */

/* The streams entering a target layer (after its engram), averaged: the draft's context. */
static void capture_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int D = c->hidden;
    hc_collapse(c, s->x + (size_t)t * c->hc_mult * D, NULL,
                s->main_hidden +
                    ((size_t)t * c->n_draft_targets + (size_t)m->target_slot[f->l]) * D);
}

/* A ring entry from a stage's wkv row: as the stage's own window KV would be (kv_norm, RoPE at
 * the position, FP8 rounding), into its ring slot. */
static void draft_ring_row(fwd_t *f, int t)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int hd = c->head_dim;
    const float *kv = s->kv + (size_t)t * hd;
    float *dst = bt_kv_region(tok_state(f, t), f->lay->window_off[f->l]) +
                 (size_t)(s->tok_pos[t] % c->window) * hd;
    bt_cpu_rmsnorm(dst, kv, m->layer[f->l].kv_norm, hd, (float)c->rms_eps);
    bt_cpu_rope(dst, hd, s->cos_main + (size_t)t * m->half_main,
                s->sin_main + (size_t)t * m->half_main, m->half_main, 0);
    bt_fake_quant_fp8_ue8m0(dst, hd, 32);
}

/* Each position's context input main_x = main_norm(main_proj(captured streams)), and from it
 * every draft stage's window-ring entry; of a sequence's rows only the last window's, the ones
 * a ring keeps. */
static void draft_rings(fwd_t *f)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int D = c->hidden, hd = c->head_dim, T = c->n_draft_targets;
    for (int q = 0; q < f->n_seqs; q++) {
        int n = f->seqs[q].n, from = n > c->window ? n - c->window : 0;
        int t0 = f->seq_first[q] + from, rows = n - from;
        float *mx = s->main_x + (size_t)t0 * D;
        bt_cpu_matmul(
            m->pool, mx,
            aq_input(m, s->main_hidden + (size_t)t0 * T * D, rows, T * D, m->main_proj_lowp),
            m->main_proj, rows, D, T * D);
        for (int i = 0; i < rows; i++)
            bt_cpu_rmsnorm(mx + (size_t)i * D, mx + (size_t)i * D, m->main_norm, D,
                           (float)c->rms_eps);
        for (int j = 0; j < c->n_draft; j++) {
            f->l = c->n_layers + j;
            bt_cpu_matmul(m->pool, s->kv + (size_t)t0 * hd,
                          aq_input(m, mx, rows, D, m->layer[f->l].lowp & AQ_WKV),
                          m->layer[f->l].wkv, rows, hd, D);
            for (int i = 0; i < rows; i++)
                draft_ring_row(f, t0 + i);
        }
    }
}

/* Each token's embedding into every stream; the first site collapses stream 0 only. Under TP
 * each rank holds a slice of the vocabulary: the owner contributes the row, the others zeros,
 * and the sum (adding zeros is exact) gives every rank the row. False when the sum failed. */
static bool embed_tokens(fwd_t *f)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int N = f->N, D = c->hidden, hc = c->hc_mult;
    for (int t = 0; t < N; t++) {
        int id = f->seqs[s->tok_seq[t]].ids[t - f->seq_first[s->tok_seq[t]]];
        float *e = s->hidden + (size_t)t * D;
        if (id >= m->v0 && id < m->v0 + m->vl)
            memcpy(e, m->embed + (size_t)(id - m->v0) * D, (size_t)D * sizeof(float));
        else
            memset(e, 0, (size_t)D * sizeof(float));
    }
    if (m->tp_size > 1 && !tp_ok(f, bt_comm_all_reduce_f32(m->comm, s->hidden, (size_t)N * D)))
        return false;
    for (int t = 0; t < N; t++) {
        const float *e = s->hidden + (size_t)t * D;
        for (int k = 0; k < hc; k++)
            memcpy(s->x + ((size_t)t * hc + k) * D, e, (size_t)D * sizeof(float));
        for (int k = 0; k < hc; k++)
            s->pre_mix[t * hc + k] = k == 0 ? 1.0f : 0.0f;
        s->topk_set[t] = 0;
        s->cand_set[t] = 0;
    }
    return true;
}

/* rows of h [rows][hidden] scored by the head into out [rows][vocab] (TP: each rank its
 * vocabulary slice, gathered); false when the gather failed */
static bool head_logits(fwd_t *f, const float *h, int rows, float *out)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    int D = c->hidden;
    if (m->tp_size == 1) {
        bt_cpu_matmul(m->pool, out, h, m->head, rows, c->vocab, D);
        return true;
    }
    /* gather [rank][row][vpad] */
    float *mine = m->tp_logits;
    memset(mine, 0, (size_t)rows * m->vpad * sizeof(float));
    for (int i = 0; i < rows; i++)
        bt_cpu_matmul(m->pool, mine + (size_t)i * m->vpad, h + (size_t)i * D, m->head, 1, m->vl, D);
    if (!tp_ok(f, bt_comm_all_gather(m->comm, mine, (size_t)rows * m->vpad * sizeof(float),
                                     m->gather)))
        return false;
    for (int i = 0; i < rows; i++)
        for (int r = 0; r < m->tp_size; r++) {
            int v0 = r * m->vpad, vl = c->vocab - v0 < m->vpad ? c->vocab - v0 : m->vpad;
            if (vl > 0)
                memcpy(out + (size_t)i * c->vocab + v0,
                       m->gather + ((size_t)r * rows + i) * m->vpad, (size_t)vl * sizeof(float));
        }
    return true;
}

/* ---- the whole forward ------------------------------------------------------------------ */

static void angles_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    scratch_t *s = &m->s;
    bt_cpu_rope_angles(s->cos_main + (size_t)t * m->half_main, s->sin_main + (size_t)t * m->half_main,
                       m->inv_freq_main, m->half_main, s->tok_pos[t]);
    bt_cpu_rope_angles(s->cos_comp + (size_t)t * m->half_comp, s->sin_comp + (size_t)t * m->half_comp,
                       m->inv_freq_comp, m->half_comp, s->tok_pos[t]);
}

static void final_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    hc_collapse_norm(c, s->x + (size_t)t * c->hc_mult * c->hidden, s->pre_mix + t * c->hc_mult,
                     m->norm, s->hidden + (size_t)t * c->hidden);
}

static bt_status_t forward_seqs(bt_model_t *m, const bt_kv_layout_t *lay, const bt_forward_seq_t *seqs,
                                int n_seqs, float *logits, const bt_model_draw_t *draw, char *err,
                                size_t errlen);

bt_status_t bt_model_forward(bt_model_t *m, const bt_kv_layout_t *lay, const bt_forward_seq_t *seqs,
                             int n_seqs, float *logits, char *err, size_t errlen)
{
    return forward_seqs(m, lay, seqs, n_seqs, logits, NULL, err, errlen);
}

bt_status_t bt_model_forward_sample(bt_model_t *m, const bt_kv_layout_t *lay,
                                    const bt_forward_seq_t *seqs, int n_seqs, int vocab,
                                    const bt_sample_req_t *req, bt_sample_out_t *out, char *err,
                                    size_t errlen)
{
    const bt_model_config_t *c = &m->cfg;
    if (vocab < 1 || vocab > c->vocab) {
        snprintf(err, errlen, "sampling over %d ids: outside 1..%d, the model's vocabulary", vocab, c->vocab);
        return BT_ERR_INVALID_ARG;
    }
    if (n_seqs < 1 || n_seqs > m->opt.max_batch_seqs || n_seqs > BT_MODEL_MAX_SEQS) {
        snprintf(err, errlen, "batch of %d sequences outside 1..%d", n_seqs, m->opt.max_batch_seqs);
        return BT_ERR_INVALID_ARG;
    }
    for (int q = 0; q < n_seqs; q++) {
        if (seqs[q].all_logits) {
            snprintf(err, errlen, "sequence %d: a draw takes the last row of logits, not all_logits", q);
            return BT_ERR_INVALID_ARG;
        }
        if (req[q].n_top < 0 || req[q].n_top > BT_SAMPLE_TOP_MAX) {
            snprintf(err, errlen, "sequence %d: %d most likely tokens asked, outside 0..%d", q, req[q].n_top,
                     BT_SAMPLE_TOP_MAX);
            return BT_ERR_INVALID_ARG;
        }
        if (req[q].n_adj < 0 || (req[q].n_adj > 0 && (!req[q].adj_ids || !req[q].adj))) {
            snprintf(err, errlen, "sequence %d: %d logit adjustments without their ids or amounts", q, req[q].n_adj);
            return BT_ERR_INVALID_ARG;
        }
        for (int i = 0; i < req[q].n_adj; i++)
            if (req[q].adj_ids[i] < 0 || req[q].adj_ids[i] >= vocab) {
                snprintf(err, errlen, "sequence %d: logit adjustment of id %d outside 0..%d", q, req[q].adj_ids[i],
                         vocab - 1);
                return BT_ERR_INVALID_ARG;
            }
    }
#ifdef BT_HAVE_CUDA_MODEL
    if (m->cuda && bt_model_cuda_draws(m, n_seqs)) {
        const bt_model_draw_t d = {req, out, vocab};
        return forward_seqs(m, lay, seqs, n_seqs, NULL, &d, err, errlen);
    }
#endif
    /* (no failure once the arguments passed: a TP group's lead has broadcast its plan, and its
     * followers wait in this forward's collectives) */
    if (!m->draw_logits) m->draw_logits = bt_malloc_or_die((size_t)m->opt.max_batch_seqs * (size_t)c->vocab * sizeof(float));
    if (m->draw_vocab != vocab) {
        bt_sampler_destroy(m->draw_sampler);
        m->draw_sampler = bt_sampler_create(vocab);
        m->draw_vocab = vocab;
    }
    bt_status_t rc = forward_seqs(m, lay, seqs, n_seqs, m->draw_logits, NULL, err, errlen);
    if (rc != BT_OK) return rc;
    for (int q = 0; q < n_seqs; q++) {
        const bt_sample_req_t *r = &req[q];
        float *row = m->draw_logits + (size_t)q * c->vocab;
        for (int i = 0; i < r->n_adj; i++) row[r->adj_ids[i]] -= r->adj[i];
        if (r->allow)
            for (int i = 0; i < vocab; i++)
                if (!((r->allow[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
        float lp = 0.0f;
        const int n_top = r->n_top < vocab ? r->n_top : vocab;
        out[q].id = bt_sampler_sample(m->draw_sampler, &r->sampling, row, r->step, r->want_logprob ? &lp : NULL,
                                      out[q].top, n_top);
        out[q].logprob = lp;
        for (int k = n_top; k < BT_SAMPLE_TOP_MAX; k++) out[q].top[k] = (bt_top_logprob_t){-1, 0.0f};
    }
    return BT_OK;
}

static bt_status_t forward_seqs(bt_model_t *m, const bt_kv_layout_t *lay, const bt_forward_seq_t *seqs,
                                int n_seqs, float *logits, const bt_model_draw_t *draw, char *err,
                                size_t errlen)
{
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    if (n_seqs < 1 || n_seqs > m->opt.max_batch_seqs || n_seqs > BT_MODEL_MAX_SEQS) {
        snprintf(err, errlen, "batch of %d sequences outside 1..%d", n_seqs, m->opt.max_batch_seqs);
        return BT_ERR_INVALID_ARG;
    }
    if (lay->n_layers != c->n_layers || lay->head_dim != c->head_dim || lay->window != c->window) {
        snprintf(err, errlen, "kv layout does not belong to this model");
        return BT_ERR_INVALID_ARG;
    }
    fwd_t f;
    memset(&f, 0, sizeof f);
    f.m = m;
    f.lay = lay;
    f.seqs = seqs;
    f.n_seqs = n_seqs;
    int N = 0;
    for (int q = 0; q < n_seqs; q++) {
        const bt_forward_seq_t *seq = &seqs[q];
        int64_t start = bt_kv_header(seq->state)->n_tokens;
        if (seq->n < 1) {
            snprintf(err, errlen, "sequence %d has no tokens", q);
            return BT_ERR_INVALID_ARG;
        }
        if (start + seq->n > lay->max_ctx || start + seq->n > m->opt.max_ctx) {
            snprintf(err, errlen, "sequence %d: %lld + %d tokens exceed the context capacity %lld", q,
                     (long long)start, seq->n, (long long)(lay->max_ctx < m->opt.max_ctx ? lay->max_ctx : m->opt.max_ctx));
            return BT_ERR_TOO_LONG;
        }
        if (N + seq->n > m->opt.max_batch_tokens) {
            snprintf(err, errlen, "batch of more than %d tokens", m->opt.max_batch_tokens);
            return BT_ERR_TOO_LONG;
        }
        for (int i = 0; i < seq->n; i++) {
            if (seq->ids[i] < 0 || seq->ids[i] >= c->vocab) {
                snprintf(err, errlen, "sequence %d: token id %d at %d outside the vocabulary (0..%d)", q,
                         seq->ids[i], i, c->vocab - 1);
                return BT_ERR_BAD_REQUEST;
            }
        }
        f.seq_first[q] = N;
        N += seq->n;
    }
    f.N = N;
    for (int q = 0; q < n_seqs; q++) {
        if (!seqs[q].undo) continue;
        if (seqs[q].n > seqs[q].undo->max_rows) {
            snprintf(err, errlen, "sequence %d: %d tokens to verify, the undo record holds %d", q,
                     seqs[q].n, seqs[q].undo->max_rows);
            return BT_ERR_INVALID_ARG;
        }
    }
    for (int q = 0; q < n_seqs; q++)
        if (seqs[q].undo) bt_model__undo_record(m, lay, &seqs[q]);
#ifdef BT_HAVE_CUDA_MODEL
    if (m->cuda) return bt_model_cuda_forward(m, lay, seqs, n_seqs, f.seq_first, N, logits, draw, err, errlen);
#endif
    for (int q = 0; q < n_seqs; q++) {
        int64_t start = bt_kv_header(seqs[q].state)->n_tokens;
        for (int i = 0; i < seqs[q].n; i++) {
            s->tok_seq[f.seq_first[q] + i] = q;
            s->tok_pos[f.seq_first[q] + i] = start + i;
        }
    }
    int D = c->hidden;

    if (!embed_tokens(&f)) goto comm_failed;
    for_tokens(&f, angles_token);
    if (c->n_engram > 0) {
        bt_model__engram_hashes(m, seqs, n_seqs, f.seq_first, s->cid, s->hash);
        if (m->tap) m->tap(m->tap_ctx, BT_TAP_ENGRAM_HASH, -1, s->hash, N);
    }

    for (int l = 0; l < c->n_layers; l++) {
        f.l = l;
        if (c->layer[l].engram_index >= 0) for_tokens(&f, engram_token);
        if (m->target_slot[l] >= 0) for_tokens(&f, capture_token);
        for_tokens(&f, attn_mix_token);
        attention(&f);
        if (f.comm_status != BT_OK) goto comm_failed;
        if (m->tap) m->tap(m->tap_ctx, BT_TAP_ATTN_OUT, l, s->out, N);
        for_tokens(&f, expand_token);
        if (!moe_sublayer(&f)) goto comm_failed;
        if (m->tap) m->tap(m->tap_ctx, BT_TAP_FFN_OUT, l, s->out, N);
        for_tokens(&f, expand_token);
        if (m->tap) m->tap(m->tap_ctx, BT_TAP_LAYER_OUT, l, s->x, N);
    }
    for_tokens(&f, final_token);
    if (m->tap) m->tap(m->tap_ctx, BT_TAP_FINAL_HIDDEN, -1, s->hidden, N);
    if (c->n_draft) draft_rings(&f);

    if (logits) {
        float *row = logits;
        for (int q = 0; q < n_seqs; q++) {
            const bt_forward_seq_t *seq = &seqs[q];
            int from = seq->all_logits ? 0 : seq->n - 1;
            int rows = seq->n - from;
            if (!head_logits(&f, s->hidden + (size_t)(f.seq_first[q] + from) * D, rows, row))
                goto comm_failed;
            row += (size_t)rows * c->vocab;
        }
    }

    /* advance the sequences: engram history, then the position counter */
    for (int q = 0; q < n_seqs; q++) {
        const bt_forward_seq_t *seq = &seqs[q];
        bt_kv_header_t *h = bt_kv_header(seq->state);
        if (c->n_engram > 0)
            for (int i = 0; i < seq->n; i++)
                h->engram_hist[(h->n_tokens + i) % BT_KV_ENGRAM_HISTORY] = s->cid[f.seq_first[q] + i];
        h->n_tokens += seq->n;
    }
    return BT_OK;
comm_failed:
    /* a rank of the group failed mid-forward: the sequences' KV state is torn, the caller
     * must drop them */
    snprintf(err, errlen, "tensor-parallel group failed (%s): a rank died or stalled", bt_status_str(f.comm_status));
    return f.comm_status;
}

/* ---- DSpark: the draft ------------------------------------------------------------------ */

int bt_model_batch_invariant_rows(const bt_model_t *m)
{
#ifdef BT_HAVE_CUDA_MODEL
    if (m->cuda) return bt_model_cuda_invariant_rows(m->cuda);
#endif
    (void)m;
    return 0;
}

int bt_model_draft_block(const bt_model_t *m)
{
    return m->cfg.n_draft ? m->cfg.draft_block : 0;
}

int bt_model_verify_rows(const bt_model_t *m)
{
    const bt_model_config_t *c = &m->cfg;
    if (!c->n_draft) return 0;
    /* a rollback restores ring slots and engram history by position, so the rows of one
     * verification must not wrap either */
    int rows = c->draft_block + 1;
    if (rows > c->window) rows = c->window;
    if (rows > BT_KV_ENGRAM_HISTORY) rows = BT_KV_ENGRAM_HISTORY;
    return rows;
}

/* A block row attends to its stage's ring (the context's main_x entries, every filled slot)
 * and to all the block's rows, both ways; the sink as in the backbone. */
static void draft_attend_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    const layer_weights_t *w = &m->layer[f->l];
    scratch_t *s = &m->s;
    int hd = c->head_dim, H = m->hl, W = c->window;
    int q_seq = s->tok_seq[t];
    uint8_t *state = f->seqs[q_seq].state;
    int64_t start = bt_kv_header(state)->n_tokens;
    int first = f->seq_first[q_seq], B = f->seqs[q_seq].n;
    int n_ring = start < W ? (int)start : W;
    const float *ring = bt_kv_region(state, f->lay->window_off[f->l]);
    const float **keys = s->task_keys + (size_t)task * s->probs_stride;
    for (int j = 0; j < n_ring; j++)
        keys[j] = ring + (size_t)j * hd;
    for (int j = 0; j < B; j++)
        keys[n_ring + j] = s->kv + (size_t)(first + j) * hd;
    float *p = s->probs + (size_t)t * s->probs_stride;
    float scale = 1.0f / sqrtf((float)hd);
    const float *cs = s->cos_main + (size_t)t * m->half_main,
                *sn = s->sin_main + (size_t)t * m->half_main;
    for (int h = 0; h < H; h++) {
        float *o = s->attn + ((size_t)t * H + h) * hd;
        attend_head(s->q + ((size_t)t * H + h) * hd, keys, n_ring + B, w->attn_sink[h], scale, hd,
                    p, o);
        bt_cpu_rope(o, hd, cs, sn, m->half_main, 1);
    }
}

static void draft_collapse_token(fwd_t *f, int t, int task)
{
    bt_model_t *m = f->m;
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int D = c->hidden;
    float *pre = s->draft_pre + (size_t)t * D;
    hc_collapse(c, s->x + (size_t)t * c->hc_mult * D, s->pre_mix + t * c->hc_mult, pre);
    bt_cpu_rmsnorm(s->hidden + (size_t)t * D, pre, m->draft_norm, D, (float)c->rms_eps);
}

int32_t bt_model__argmax(const float *row, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

bt_status_t bt_model_draft(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *const *states,
                           const int32_t *last, int n_seqs, bt_draft_choose_fn choose, void *ctx,
                           int32_t *drafts, float *conf, char *err, size_t errlen)
{
    const bt_model_config_t *c = &m->cfg;
    scratch_t *s = &m->s;
    int B = c->draft_block, D = c->hidden, V = c->vocab, R = c->draft_markov_rank;
    if (!c->n_draft) {
        snprintf(err, errlen, "the model runs without DSpark draft stages");
        return BT_ERR_INVALID_ARG;
    }
    if (n_seqs < 1 || n_seqs > m->opt.max_batch_seqs || n_seqs > BT_MODEL_MAX_SEQS ||
        n_seqs * B > m->opt.max_batch_tokens) {
        snprintf(err, errlen, "draft for %d sequences: outside 1..%d (and %d rows a forward)",
                 n_seqs, m->opt.max_batch_seqs, m->opt.max_batch_tokens);
        return BT_ERR_INVALID_ARG;
    }
    if (lay->n_rings != c->n_layers + c->n_draft || lay->window != c->window) {
        snprintf(err, errlen, "kv layout does not belong to this model (it has no draft rings)");
        return BT_ERR_INVALID_ARG;
    }
    for (int q = 0; q < n_seqs; q++) {
        if (bt_kv_header(states[q])->n_tokens < 1) {
            snprintf(err, errlen, "sequence %d: a draft needs at least one position run", q);
            return BT_ERR_INVALID_ARG;
        }
        if (last[q] < 0 || last[q] >= V) {
            snprintf(err, errlen, "sequence %d: token id %d outside the vocabulary (0..%d)", q,
                     last[q], V - 1);
            return BT_ERR_BAD_REQUEST;
        }
    }

#ifdef BT_HAVE_CUDA_MODEL
    if (m->cuda)
        return bt_model_cuda_draft(m, lay, states, last, n_seqs, choose, ctx, drafts, conf, err,
                                   errlen);
#endif
    /* the blocks: [last, noise, ...] at the positions after each slot's */
    bt_forward_seq_t seqs[BT_MODEL_MAX_SEQS];
    fwd_t f = {.m = m, .lay = lay, .seqs = seqs, .n_seqs = n_seqs, .N = n_seqs * B};
    for (int q = 0; q < n_seqs; q++) {
        int32_t *ids = m->draft_ids + (size_t)q * B;
        ids[0] = last[q];
        for (int i = 1; i < B; i++)
            ids[i] = c->draft_noise_id;
        seqs[q] = (bt_forward_seq_t){.state = states[q], .ids = ids, .n = B};
        f.seq_first[q] = q * B;
        int64_t start = bt_kv_header(states[q])->n_tokens;
        for (int i = 0; i < B; i++) {
            s->tok_seq[q * B + i] = q;
            s->tok_pos[q * B + i] = start + i;
        }
    }
    float *logits = m->draft_logits,
          *bias = m->draft_logits + (size_t)m->opt.max_batch_seqs * B * V;
    if (!embed_tokens(&f)) goto comm_failed;
    for_tokens(&f, angles_token);
    for (int j = 0; j < c->n_draft; j++) {
        f.l = c->n_layers + j;
        for_tokens(&f, attn_mix_token);
        qkv_project(&f);
        for_tokens(&f, draft_attend_token);
        if (!attention_out(&f)) goto comm_failed;
        for_tokens(&f, expand_token);
        if (!moe_sublayer(&f)) goto comm_failed;
        for_tokens(&f, expand_token);
    }
    for_tokens(&f, draft_collapse_token);
    if (!head_logits(&f, s->hidden, f.N, logits)) goto comm_failed;

    /* row by row: the Markov bias of the token before, then the pick */
    for (int q = 0; q < n_seqs && drafts; q++) {
        int32_t prev = last[q];
        for (int i = 0; i < B; i++) {
            int t = q * B + i;
            const float *e = m->markov_embed + (size_t)prev * R;
            float *row = logits + (size_t)t * V;
            bt_cpu_matmul(m->pool, bias, e, m->markov_head, 1, V, R);
            for (int v = 0; v < V; v++)
                row[v] += bias[v];
            if (conf)
                conf[t] = bt_cpu_dot(m->conf_proj, s->draft_pre + (size_t)t * D, D) +
                          bt_cpu_dot(m->conf_proj + D, e, R);
            int32_t tok = choose ? choose(ctx, q, i, row, V) : bt_model__argmax(row, V);
            if (tok < 0 || tok >= V) {
                snprintf(err, errlen, "sequence %d: draft token %d outside the vocabulary", q, tok);
                return BT_ERR_INVALID_ARG;
            }
            drafts[t] = tok;
            prev = tok;
        }
    }
    return BT_OK;
comm_failed:
    snprintf(err, errlen, "tensor-parallel group failed (%s): a rank died or stalled",
             bt_status_str(f.comm_status));
    return f.comm_status;
}

/* ---- DSpark: rollback ------------------------------------------------------------------- */

bt_status_t bt_kv_undo_create(const bt_model_t *m, int max_rows, bt_kv_undo_t **undo_p)
{
    const bt_model_config_t *c = &m->cfg;
    if (max_rows < 1 || max_rows > c->window || max_rows > BT_KV_ENGRAM_HISTORY)
        return BT_ERR_INVALID_ARG;
    bt_kv_undo_t *u = bt_calloc_or_die(1, sizeof *u);
    size_t hd = (size_t)c->head_dim;
    u->max_rows = max_rows;
    u->n_rings = c->n_layers + c->n_draft;
    u->hd = c->head_dim;
    u->ring = bt_malloc_or_die((size_t)u->n_rings * (size_t)max_rows * hd * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) {
        const bt_layer_config_t *L = &c->layer[l];
        if (!L->is_kv_source) continue;
        size_t r = (size_t)L->compress_ratio;
        u->pend_kv[l] = bt_malloc_or_die(r * hd * sizeof(float));
        u->row_kv[l] = bt_malloc_or_die((size_t)max_rows * hd * sizeof(float));
        if (r > 1) {
            u->pend_gate[l] = bt_malloc_or_die(r * hd * sizeof(float));
            u->row_gate[l] = bt_malloc_or_die((size_t)max_rows * hd * sizeof(float));
        }
    }
    *undo_p = u;
    return BT_OK;
}

void bt_kv_undo_destroy(bt_kv_undo_t *u)
{
    if (!u) return;
    free(u->ring);
    for (int l = 0; l < BT_MAX_LAYERS; l++) {
        free(u->pend_kv[l]);
        free(u->pend_gate[l]);
        free(u->row_kv[l]);
        free(u->row_gate[l]);
    }
    free(u);
}

bt_status_t bt_model_rollback(bt_model_t *m, const bt_kv_layout_t *lay, uint8_t *state,
                              bt_kv_undo_t *u, int keep, char *err, size_t errlen)
{
    const bt_model_config_t *c = &m->cfg;
    bt_kv_header_t *h = bt_kv_header(state);
    int n = u->n;
    if (n < 1 || keep < 1 || keep > n || h->n_tokens != u->before.n_tokens + n ||
        lay->n_rings != u->n_rings) {
        snprintf(err, errlen, "rollback to %d of %d recorded tokens: no such record for this slot",
                 keep, n);
        return BT_ERR_INVALID_ARG;
    }
    u->n = 0;
    if (keep == n) return BT_OK;
    size_t hd = (size_t)c->head_dim;
    int64_t start = u->before.n_tokens;
    /* what is restored, for a device mirror of the slot */
    bt_kv_range_t rg[BT_MAX_LAYERS * (BT_KV_ENGRAM_HISTORY + 2)];
    int nr = 0;
    for (int l = 0; l < lay->n_rings; l++) {
        float *ring = bt_kv_region(state, lay->window_off[l]);
        for (int i = keep; i < n; i++) {
            size_t at = (size_t)((start + i) % c->window) * hd;
            memcpy(ring + at, u->ring + ((size_t)l * u->max_rows + i) * hd, hd * sizeof(float));
            rg[nr++] = (bt_kv_range_t){lay->window_off[l] + at * sizeof(float), hd * sizeof(float)};
        }
    }
    /* the group open after the kept tokens: older members from the record, newer ones are
     * the forward's own rows */
    for (int l = 0; l < c->n_layers; l++) {
        if (!u->pend_kv[l]) continue;
        int64_t r = c->layer[l].compress_ratio, cnt = (start + keep) % r, g0 = start + keep - cnt;
        float *pkv = bt_kv_region(state, lay->pend_kv_off[l]),
              *pgate = bt_kv_region(state, lay->pend_gate_off[l]);
        if (cnt > 0) {
            rg[nr++] = (bt_kv_range_t){lay->pend_kv_off[l], (size_t)cnt * hd * sizeof(float)};
            if (u->pend_gate[l])
                rg[nr++] = (bt_kv_range_t){lay->pend_gate_off[l], (size_t)cnt * hd * sizeof(float)};
        }
        for (int64_t j = 0; j < cnt; j++) {
            int64_t pos = g0 + j;
            bool old = pos < start;
            memcpy(pkv + j * hd, old ? u->pend_kv[l] + j * hd : u->row_kv[l] + (pos - start) * hd,
                   hd * sizeof(float));
            if (u->pend_gate[l])
                memcpy(pgate + j * hd,
                       old ? u->pend_gate[l] + j * hd : u->row_gate[l] + (pos - start) * hd,
                       hd * sizeof(float));
        }
    }
    bt_kv_header_t after = *h;
    *h = u->before;
    bt_kv_state_advance_counters(c, state, keep);
    for (int i = 0; i < keep; i++) {
        int slot = (int)((start + i) % BT_KV_ENGRAM_HISTORY);
        h->engram_hist[slot] = after.engram_hist[slot];
    }
    h->device_tag = 0;
#ifdef BT_HAVE_CUDA_MODEL
    /* the GPU's copy gets the same bytes and stays current (else the next forward would
     * upload the whole slot) */
    if (m->cuda) h->device_tag = bt_model_cuda_restored(m->cuda, state, after.device_tag, rg, nr);
#else
    (void)rg, (void)nr;
#endif
    return BT_OK;
}
