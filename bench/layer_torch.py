#!/usr/bin/env python3
"""The layer of bench/bench_layer_cuda.cu written with eager PyTorch ops, timed the same way.

Same shapes, same cases, and the same inputs: the counter-based generator of
bench_layer_cuda.cu is reproduced here bit for bit (integer ops on int64 tensors), so both
sides compute one layer on one set of numbers, and --compare DIR checks this layer's outputs
against the rows bench_layer_cuda --dump DIR wrote.

What differs, on purpose (a fair eager layer, not a port of our kernels):
  - PyTorch has no block-scaled FP8 / FP4 GEMM for the checkpoint's layouts (32x32 UE8M0 FP8
    blocks, per-32 UE8M0 FP4), so every FP8/FP4 weight is dequantized to bf16 ONCE before
    timing and the projections are bf16 F.linear / matmul (the reference's math without the
    activation rounding, as the transformers port does);
  - bf16 activations out of every matmul; RMSNorm, RoPE, softmax, mHC, router in fp32;
  - the indexer scores in bf16 (the reference's dtype) against a bf16 copy of the index keys;
  - routed experts: a loop over the experts hit, each a gather, three matmuls and an
    index_add_, as the transformers MoE does.

  layer_torch.py [--cases decode_b1,decode_b16,prefill] [--reps 30] [--warmup 5] [--seed 1]
                 [--entries 8192] [--prefill 4096] [--compare DIR] [--device cuda] [--small]
stdout: a JSON line for the device, then one per case; stderr: the same in words.
--small shrinks every width (for a CPU check of the code, not a benchmark).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F


class Dims:
    """MODEL-DS41.md's widths; --small shrinks them, keeping every multiple of 32."""

    def __init__(self, small=False):
        self.hid, self.hc, self.nh, self.hd, self.half = 5120, 4, 64, 512, 32
        self.ql, self.og, self.ol, self.win = 1280, 8, 1024, 128
        self.ih, self.id, self.itopk = 32, 128, 512
        self.ne, self.topk, self.mi = 384, 6, 2304
        if small:
            self.hid, self.nh, self.hd = 256, 4, 128
            self.ql, self.og, self.ol, self.win = 64, 2, 64, 16
            self.ih, self.id, self.itopk = 4, 64, 32
            self.ne, self.mi = 16, 64
        self.mixn = (2 + self.hc) * self.hc
        self.ogin = self.nh * self.hd // self.og


RMS_EPS, HC_EPS, HC_ITERS, ROUTE_SCALE, SWIGLU_LIMIT = 1e-20, 1e-6, 20, 1.5, 10.0
PART_NAMES = ["mhc", "attn_proj", "attn_core", "indexer", "moe_route", "experts"]
SEG_PART = ["mhc", "attn_proj", "indexer", "attn_core", "attn_proj", "mhc", "moe_route",
            "experts", "mhc"]

# ---- the generator of bench_layer_cuda.cu ------------------------------------------------
M32 = 0xFFFFFFFF
# tags: keep in step with the enum in bench_layer_cuda.cu
(TAG_X, TAG_HC_FN_A, TAG_HC_BASE_A, TAG_HC_SCALE_A, TAG_HC_FN_F, TAG_HC_BASE_F, TAG_HC_SCALE_F,
 TAG_ATTN_NORM, TAG_FFN_NORM, TAG_Q_NORM, TAG_KV_NORM, TAG_WQ_A, TAG_WQ_B, TAG_WKV, TAG_WO_A,
 TAG_WO_B, TAG_IWQ_B, TAG_WPROJ, TAG_GATE_W, TAG_GATE_BIAS, TAG_SINK, TAG_SW13, TAG_SW2, TAG_COMP,
 TAG_WIN, TAG_IKEY, TAG_PRE_IN) = range(1, 28)
TAG_W13, TAG_W2 = 1000, 2000


def mix32_int(x):
    x &= M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def _mul32(x, c):
    # x * c mod 2^32 without int64 overflow: the high half of c contributes only its low 16
    # bits of product, shifted
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & M32


def mix32(x):
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def tensor_key(seed, tag):
    return mix32_int((seed * 0x9E3779B9 + tag * 0x85EBCA6B) & M32)


CHUNK = 1 << 24


def gen_bits(n, seed, tag, dev, fn):
    """fn(r) over the tensor's n random words, in chunks; returns fn's outputs concatenated."""
    key = tensor_key(seed, tag)
    out = []
    for s in range(0, n, CHUNK):
        i = torch.arange(s, min(n, s + CHUNK), dtype=torch.int64, device=dev)
        out.append(fn(mix32(mix32(i) ^ key)))
    return torch.cat(out)


def gen_f32(shape, seed, tag, shift, add, dev):
    def f(r):
        u = (r >> 8).to(torch.float32) * (2.0 ** -23) - 1.0
        return u * (2.0 ** -shift) + add  # exact product, one rounding: as the CUDA side
    return gen_bits(math.prod(shape), seed, tag, dev, f).view(shape)


def gen_fp8(shape, seed, tag, dev):
    def f(r):
        return (((r >> 24) & 0x80) | ((4 + ((r >> 8) & 3)) << 3) | (r & 7)).to(torch.uint8)
    return gen_bits(math.prod(shape), seed, tag, dev, f).view(shape)


def gen_fp4(shape, seed, tag, dev):
    return gen_bits(math.prod(shape), seed, tag, dev, lambda r: (r & 0xFF).to(torch.uint8)).view(shape)


def e4m3_table(dev):
    v = []
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            x = float("nan")
        elif e == 0:
            x = m * 2.0 ** -9
        else:
            x = (1 + m / 8) * 2.0 ** (e - 7)
        v.append(-x if b & 0x80 else x)
    return torch.tensor(v, dtype=torch.float32, device=dev)


def e2m1_table(dev):
    v = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    return torch.tensor(v + [-x for x in v], dtype=torch.float32, device=dev)


def dequant_fp8(w, scale_byte, lut):
    """FP8 e4m3 [N,K] with UE8M0 scales on 32x32 blocks -> bf16 (exact)."""
    N, K = w.shape
    s = torch.full(((N + 31) // 32, (K + 31) // 32), 2.0 ** (scale_byte - 127), device=w.device)
    s = s.repeat_interleave(32, 0)[:N].repeat_interleave(32, 1)[:, :K]
    return (lut[w.long()] * s).to(torch.bfloat16)


def dequant_fp4(w, scale_byte, lut):
    """FP4 e2m1 [N, K/2] (low nibble = even index) with UE8M0 per 32 along K -> bf16."""
    N = w.shape[0]
    codes = torch.stack([w & 15, w >> 4], -1).view(N, -1).long()
    return (lut[codes] * 2.0 ** (scale_byte - 127)).to(torch.bfloat16)


def yarn_inv_freq(half, dev):
    theta, factor, orig, dim = 160000.0, 16.0, 65536.0, 2 * half
    lo = math.floor(dim * math.log(orig / (32 * 2 * math.pi)) / (2 * math.log(theta)))
    hi = math.ceil(dim * math.log(orig / (1 * 2 * math.pi)) / (2 * math.log(theta)))
    lo, hi = max(lo, 0), min(hi, dim - 1)
    i = torch.arange(half, dtype=torch.float32)
    pf = torch.tensor(theta, dtype=torch.float32) ** (2 * i / dim)
    ramp = ((i - lo) / (hi - lo)).clamp(0, 1)
    return ((1 / (factor * pf)) * ramp + (1 / pf) * (1 - ramp)).to(dev)


# ---- the model's pieces ------------------------------------------------------------------
def rms(x, w, eps=RMS_EPS):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, cos, sin, half, inverse=False):
    """Interleaved pairs of the last 2*half channels; x [T, H, D] float, cos/sin [T, half]."""
    r = x[..., -2 * half:].unflatten(-1, (half, 2))
    e, o = r[..., 0], r[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    if inverse:
        s = -s
    rot = torch.stack([e * c - o * s, e * s + o * c], -1).flatten(-2)
    return torch.cat([x[..., :-2 * half], rot], -1)


def pow2_ceil(t):
    m, e = torch.frexp(t)  # t = m 2^e, m in [0.5, 1)
    return torch.exp2((e - (m == 0.5).to(e.dtype)).to(torch.float32))


def fake_quant_fp8(x, block=32):
    """The window-KV QAT rounding: e4m3 with a UE8M0 scale per 32, round to nearest even."""
    xb = x.unflatten(-1, (-1, block))
    scale = pow2_ceil(xb.abs().amax(-1, keepdim=True).clamp_min(1e-4) * (1 / 448))
    q = (xb / scale).clamp(-448, 448)
    _, e = torch.frexp(q)
    step = torch.exp2((torch.clamp(e - 1, min=-6) - 3).to(torch.float32))
    return (torch.round(q / step) * step * scale).flatten(-2)


def fake_quant_fp4(x, block=32):
    """The indexer-query QAT rounding: e2m1 with a UE8M0 scale per 32 (ties to the even code,
    which is the even multiple of each binade's step)."""
    xb = x.unflatten(-1, (-1, block))
    scale = pow2_ceil(xb.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -126) * (1 / 6))
    q = (xb / scale).clamp(-6, 6)
    a = q.abs()
    step = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a),
                                                                   torch.full_like(a, 2.0)))
    return (torch.round(q / step) * step * scale).flatten(-2)


def hc_mix(X, fn, base, scale, d):
    T = X.shape[0]
    v = X.reshape(T, -1)
    m = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + RMS_EPS)) @ fn.t()
    hc = d.hc
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + HC_EPS
    post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    c = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(T, hc, hc)
    c = torch.softmax(c, -1) + HC_EPS
    c = c / (c.sum(-2, keepdim=True) + HC_EPS)
    for _ in range(HC_ITERS - 1):
        c = c / (c.sum(-1, keepdim=True) + HC_EPS)
        c = c / (c.sum(-2, keepdim=True) + HC_EPS)
    return pre, post, c


def hc_collapse(X, pre, norm_w):
    return rms((pre[:, :, None] * X).sum(1), norm_w).to(torch.bfloat16)


def hc_expand(X, o, post, comb):
    return torch.einsum("tjk,tjd->tkd", comb, X) + post[:, :, None] * o[:, None, :]


def swiglu(gu, mi, w=None):
    g, u = gu[:, :mi].clamp(max=SWIGLU_LIMIT), gu[:, mi:].clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    h = F.silu(g) * u
    return (h if w is None else w[:, None] * h).to(torch.bfloat16)


# ---- weights and cases -------------------------------------------------------------------
class Weights:
    def __init__(self, d, seed, dev):
        l8, l4 = e4m3_table(dev), e2m1_table(dev)
        bf = torch.bfloat16

        def fp8(tag, N, K, shift):
            return dequant_fp8(gen_fp8((N, K), seed, tag, dev), 127 - shift, l8)

        self.wq_a = fp8(TAG_WQ_A, d.ql, d.hid, 6)
        self.wq_b = fp8(TAG_WQ_B, d.nh * d.hd, d.ql, 5)
        self.wkv = fp8(TAG_WKV, d.hd, d.hid, 6)
        self.wo_a = fp8(TAG_WO_A, d.og * d.ol, d.ogin, 6).view(d.og, d.ol, d.ogin)
        self.wo_b = fp8(TAG_WO_B, d.hid, d.og * d.ol, 7)
        self.iwq_b = fp8(TAG_IWQ_B, d.ih * d.id, d.ql, 5)
        self.sw13 = fp8(TAG_SW13, 2 * d.mi, d.hid, 6)
        self.sw2 = fp8(TAG_SW2, d.hid, d.mi, 6)
        # weights_proj includes the reference's heads^-0.5 (see bench_layer_cuda.cu)
        self.wproj = gen_f32((d.ih, d.hid), seed, TAG_WPROJ, 6, 0.0, dev).to(bf)
        # the router runs in fp32 (the reference); its weights are the checkpoint's bf16
        self.gate = gen_f32((d.ne, d.hid), seed, TAG_GATE_W, 6, 0.0, dev).to(bf).float()
        self.gate_bias = gen_f32((d.ne,), seed, TAG_GATE_BIAS, 4, 0.0, dev)
        self.sink = gen_f32((d.nh,), seed, TAG_SINK, 0, 0.0, dev)
        self.attn_norm = gen_f32((d.hid,), seed, TAG_ATTN_NORM, 2, 1.0, dev)
        self.ffn_norm = gen_f32((d.hid,), seed, TAG_FFN_NORM, 2, 1.0, dev)
        self.q_norm = gen_f32((d.ql,), seed, TAG_Q_NORM, 2, 1.0, dev)
        self.kv_norm = gen_f32((d.hd,), seed, TAG_KV_NORM, 2, 1.0, dev)
        self.hc = []
        for t0 in (TAG_HC_FN_A, TAG_HC_FN_F):
            self.hc.append((gen_f32((d.mixn, d.hc * d.hid), seed, t0, 8, 0.0, dev),
                            gen_f32((d.mixn,), seed, t0 + 1, 1, 0.0, dev),
                            gen_f32((3,), seed, t0 + 2, 2, 0.5, dev)))
        self.w13, self.w2 = [], []
        for e in range(d.ne):  # bf16, dequantized once: 27 GB at the real widths
            self.w13.append(dequant_fp4(gen_fp4((2 * d.mi, d.hid // 2), seed, TAG_W13 + e, dev),
                                        127 - 8, l4))
            self.w2.append(dequant_fp4(gen_fp4((d.hid, d.mi // 2), seed, TAG_W2 + e, dev),
                                       127 - 8, l4))
        self.inv_freq = yarn_inv_freq(d.half, dev)


class Case:
    """Positions, windows and caches as bench_layer_cuda.cu's case_make lays them out."""

    def __init__(self, name, d, seed, entries, prefill, dev):
        self.name, self.n = name, entries
        if name in ("decode_b1", "decode_b16"):
            self.seqs = self.T = 16 if name == "decode_b16" else 1
            self.tps = 1
            win_rows = self.seqs * d.win
        elif name == "prefill":
            self.seqs, self.T, self.tps = 1, prefill, prefill
            win_rows = d.win + prefill
        else:
            raise SystemExit(f"unknown case {name} (decode_b1, decode_b16, prefill)")
        T, n = self.T, entries
        self.x0 = gen_f32((T, d.hc, d.hid), seed, TAG_X, 0, 0.0, dev)
        self.pre_in = gen_f32((T, d.hc), seed, TAG_PRE_IN, 2, 0.5, dev)
        self.comp = gen_f32((self.seqs * n, d.hd), seed, TAG_COMP, 0, 0.0, dev).to(torch.bfloat16)
        self.win = gen_f32((win_rows, d.hd), seed, TAG_WIN, 0, 0.0, dev).to(torch.bfloat16)
        # the model's index keys carry the compressor's FP4 rounding, as its queries do
        self.ikeys32 = fake_quant_fp4(gen_f32((self.seqs, n, d.id), seed, TAG_IKEY, 0, 0.0, dev))
        self.ikeys = self.ikeys32.to(torch.bfloat16)
        t = torch.arange(T)
        s = t // self.tps
        p0 = n - self.tps
        pos = p0 + t % self.tps
        q = pos[:, None] - (d.win - 1) + torch.arange(d.win)[None, :]
        if self.tps == 1:
            win_idx = s[:, None] * d.win + q % d.win
            kv_row = s * d.win + pos % d.win
        else:
            win_idx = torch.where(q >= p0, d.win + (q - p0), q % d.win)
            kv_row = d.win + t
        self.pos = pos.to(dev)
        self.visible = (pos + 1).to(dev).view(self.seqs, self.tps)
        self.win_idx, self.kv_row = win_idx.to(dev), kv_row.to(dev)
        self.seq_base = (s * n).to(dev)


def layer(W, c, d, mark, f32_index=False):
    """One layer from c.x0; mark(i) at the segment boundaries. Returns what --compare checks.
    f32_index: the indexer's projections and scores in fp32 against the fp32 keys, as our
    kernels compute them (untimed; it tells how much of the difference the picks make)."""
    T, bf, f32 = c.T, torch.bfloat16, torch.float32
    ang = c.pos.to(f32)[:, None] * W.inv_freq[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    X = c.x0
    mark(0)
    fn, base, scale = W.hc[0]
    pre_a, post, comb = hc_mix(X, fn, base, scale, d)
    xin = hc_collapse(X, c.pre_in, W.attn_norm)
    mark(1)

    qr = rms(F.linear(xin, W.wq_a).float(), W.q_norm).to(bf)
    q = F.linear(qr, W.wq_b).view(T, d.nh, d.hd)
    q[..., -2 * d.half:] = rope(q[..., -2 * d.half:].float(), cos, sin, d.half).to(bf)
    kv = rms(F.linear(xin, W.wkv).float(), W.kv_norm)
    kv = fake_quant_fp8(rope(kv[:, None, :], cos, sin, d.half)[:, 0])
    c.win[c.kv_row] = kv.to(bf)
    mark(2)

    if f32_index:
        qi = (qr.float() @ W.iwq_b.float().t()).view(T, d.ih, d.id)
        w = xin.float() @ W.wproj.float().t()
    else:
        qi = F.linear(qr, W.iwq_b).float().view(T, d.ih, d.id)
        w = F.linear(xin, W.wproj).float()
    qi = fake_quant_fp4(rope(qi, cos, sin, d.half))
    if f32_index:
        sc = torch.matmul(qi.view(c.seqs, c.tps * d.ih, d.id), c.ikeys32.transpose(1, 2))
    else:
        sc = torch.matmul(qi.to(bf).view(c.seqs, c.tps * d.ih, d.id), c.ikeys.transpose(1, 2))
    sc = (torch.relu(sc.float()) * d.id ** -0.5).view(c.seqs, c.tps, d.ih, c.n)
    sc = (sc * w.view(c.seqs, c.tps, d.ih, 1)).sum(2)
    j = torch.arange(c.n, device=sc.device)
    sc = sc.masked_fill(j[None, None, :] >= c.visible[:, :, None], float("-inf")).view(T, c.n)
    top = torch.topk(sc, min(d.itopk, c.n), dim=-1)
    sel = torch.where(torch.isinf(top.values), -1, top.indices)
    sel = torch.sort(sel, dim=-1).values
    mark(3)

    valid = sel >= 0
    keys = torch.cat([c.win[c.win_idx], c.comp[(sel + c.seq_base[:, None]).clamp(min=0)]], 1)
    s = torch.matmul(q, keys.transpose(1, 2)).float() * d.hd ** -0.5  # [T, H, W + k]
    mask = torch.cat([torch.ones_like(c.win_idx, dtype=torch.bool), valid], 1)
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    sink = W.sink[None, :, None]
    mx = torch.maximum(s.amax(-1, keepdim=True), sink)
    p = torch.exp(s - mx)
    p = p / (p.sum(-1, keepdim=True) + torch.exp(sink - mx))
    o = torch.matmul(p.to(bf), keys).float()
    o = rope(o, cos, sin, d.half, inverse=True).to(bf)
    mark(4)

    oa = torch.bmm(o.view(T, d.og, d.ogin).transpose(0, 1), W.wo_a.transpose(1, 2))
    o_attn = F.linear(oa.transpose(0, 1).reshape(T, d.og * d.ol), W.wo_b)
    mark(5)

    X = hc_expand(X, o_attn.float(), post, comb)
    fn, base, scale = W.hc[1]
    pre_f, post, comb = hc_mix(X, fn, base, scale, d)
    xin = hc_collapse(X, pre_a, W.ffn_norm)
    mark(6)

    logits = xin.float() @ W.gate.t()
    s = torch.sqrt(F.softplus(logits))
    idx = torch.topk(s + W.gate_bias, d.topk, dim=-1).indices
    wts = s.gather(1, idx)
    wts = wts / (wts.sum(-1, keepdim=True) + 1e-20) * ROUTE_SCALE
    mark(7)

    y = torch.zeros(T, d.hid, dtype=f32, device=X.device)
    for e in torch.unique(idx).tolist():
        tok, slot = torch.where(idx == e)
        h = swiglu(F.linear(xin[tok], W.w13[e]).float(), d.mi, wts[tok, slot])
        y.index_add_(0, tok, F.linear(h, W.w2[e]).float())
    y = y + F.linear(swiglu(F.linear(xin, W.sw13).float(), d.mi), W.sw2).float()
    mark(8)
    X = hc_expand(X, y, post, comb)
    mark(9)
    return {"attn": o_attn.float(), "moe": y, "x": X, "idx": idx, "pre_attn": pre_a,
            "post_ffn": post, "comb_ffn": comb,
            "sel": torch.where(valid, sel, -1)}  # each sequence's own entries, as ours dumps them


class Marks:
    """Segment boundaries: CUDA events on a GPU, the host clock (after a sync) elsewhere."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"
        self.ev = [torch.cuda.Event(enable_timing=True) for _ in range(10)] if self.cuda else None
        self.t = [0.0] * 10

    def __call__(self, i):
        if self.cuda:
            self.ev[i].record()
        else:
            self.t[i] = time.perf_counter()

    def read(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [self.ev[i].elapsed_time(self.ev[i + 1]) for i in range(9)]
        return [(self.t[i + 1] - self.t[i]) * 1e3 for i in range(9)]


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def compare(out, c, d, cmp_dir):
    """Relative L2 error of this layer's rows against bench_layer_cuda's dump of them."""
    rows = list(range(c.T)) if c.T <= 16 else [0, 1, 2, 3, c.T // 2, c.T - 3, c.T - 2, c.T - 1]
    res = {}
    widths = {"attn": d.hid, "moe": d.hid, "x": d.hc * d.hid, "pre_attn": d.hc,
              "post_ffn": d.hc, "comb_ffn": d.hc * d.hc}
    for what, width in widths.items():
        path = os.path.join(cmp_dir, f"{c.name}_{what}.bin")
        if not os.path.exists(path):
            res[what] = None
            continue
        with open(path, "rb") as f:
            ref = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).view(len(rows), width)
        mine = out[what].reshape(c.T, -1)[rows].float().cpu()
        res[what] = float((mine - ref).norm() / ref.norm().clamp_min(1e-30))
    # the same picks, as a fraction: routed experts, and the indexer's selected entries
    for what, width, key in (("idx", d.topk, "experts_same"), ("sel", d.itopk, "selected_same")):
        path = os.path.join(cmp_dir, f"{c.name}_{what}.bin")
        if not os.path.exists(path):
            continue
        with open(path, "rb") as f:
            ref = torch.frombuffer(bytearray(f.read()), dtype=torch.int32).view(len(rows), width)
        mine = out[what][rows].cpu()
        same = sum(len(set(a.tolist()) & set(b.tolist()) - {-1}) for a, b in zip(mine, ref))
        total = sum(len(set(b.tolist()) - {-1}) for b in ref)
        res[key] = round(same / max(total, 1), 4)
    return res


def time_compiled(W, d, a, dev):
    """torch.compile of the whole layer (default mode): the expert loop's host syncs break the
    graph, so it compiles in pieces. The first call's wall time includes compiling."""
    fn = torch.compile(layer)
    for cname in a.cases.split(","):
        c = Case(cname, d, a.seed, a.entries, a.prefill, dev)
        nop = lambda i: None  # noqa: E731 (no events inside the compiled code)
        t0 = time.time()
        fn(W, c, d, nop)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        first_s = time.time() - t0
        tot = []
        for it in range(a.warmup + a.reps):
            if dev.type == "cuda":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn(W, c, d, nop)
                e1.record()
                torch.cuda.synchronize()
                ms = e0.elapsed_time(e1)
            else:
                t1 = time.perf_counter()
                fn(W, c, d, nop)
                ms = (time.perf_counter() - t1) * 1e3
            if it >= a.warmup:
                tot.append(ms)
        rec = {"case": cname, "side": "torch_compile", "T": c.T, "ms": round(median(tot), 4),
               "first_call_s": round(first_s, 1)}
        print(json.dumps(rec), flush=True)
        print(f"{cname:10s} T={c.T:<5d} torch.compile {rec['ms']:.3f} ms "
              f"(first call, compiling: {first_s:.1f} s)", file=sys.stderr)
        del c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="decode_b1,decode_b16,prefill")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--entries", type=int, default=8192)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--compare", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--compile", action="store_true",
                    help="time torch.compile(layer) instead (total only; first call compiles)")
    a = ap.parse_args()
    d = Dims(a.small)
    if a.entries < d.itopk or not (d.win - 1 + a.prefill <= a.entries) or a.reps < 1:
        raise SystemExit("need --entries >= index_topk and --prefill + window - 1 <= --entries")
    dev = torch.device(a.device)
    # fp32 matmuls (mHC, router) in full fp32, as the reference
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)

    t0 = time.time()
    W = Weights(d, a.seed, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        name = torch.cuda.get_device_name(dev)
    else:
        name = "cpu"
    print(json.dumps({"side": "torch", "device": name, "torch": torch.__version__,
                      "weights_s": round(time.time() - t0, 1)}), flush=True)
    print(f"torch {torch.__version__} on {name}: weights generated and dequantized to bf16 in "
          f"{time.time() - t0:.1f} s (timing excludes it)", file=sys.stderr)

    if a.compile:
        return time_compiled(W, d, a, dev)
    for cname in a.cases.split(","):
        c = Case(cname, d, a.seed, a.entries, a.prefill, dev)
        m = Marks(dev)
        tot, parts = [], {p: [] for p in PART_NAMES}
        for it in range(a.warmup + a.reps):
            out = layer(W, c, d, m)
            seg = m.read()
            if it < a.warmup:
                continue
            tot.append(sum(seg))
            acc = dict.fromkeys(PART_NAMES, 0.0)
            for i, ms in enumerate(seg):
                acc[SEG_PART[i]] += ms
            for p in PART_NAMES:
                parts[p].append(acc[p])
        rec = {"case": cname, "side": "torch", "T": c.T, "ms": round(median(tot), 4),
               "experts_hit": len(torch.unique(out["idx"])),
               "finite": bool(torch.isfinite(out["x"]).all()),
               "parts": {p: {"ms": round(median(v), 4)} for p, v in parts.items()}}
        if a.compare:
            rec["compare"] = compare(out, c, d, a.compare)
            # the same layer with the indexer in fp32: the picks then match ours more closely
            exact = compare(layer(W, c, d, lambda i: None, f32_index=True), c, d, a.compare)
            rec["compare_f32_index"] = exact
        print(json.dumps(rec), flush=True)
        print(f"{cname:10s} T={c.T:<5d} torch eager {rec['ms']:.3f} ms; "
              + ", ".join(f"{p} {rec['parts'][p]['ms']:.3f}" for p in PART_NAMES)
              + (f"; vs ours {rec['compare']}; with an fp32 indexer {rec['compare_f32_index']}"
                 if a.compare else ""), file=sys.stderr)
        del c, out
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
