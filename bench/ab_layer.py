#!/usr/bin/env python3
"""Same-run A/B of bench_layer_cuda configurations: binaries and environment switches.

Runs differ by 2..3% on one GPU for the same code, so a change is judged against its old form
measured in the same session, turns interleaved. Each configuration is BINARY or
BINARY:NAME=VALUE[,NAME=VALUE...] (e.g. build-gpu-bench/bench_layer_cuda:BT_CUDA_PDL=0);
every round runs each configuration once, in the order given.

  ab_layer.py CONFIG [CONFIG ...] [--cases decode_b1,decode_b16,prefill] [--reps 30]
              [--rounds 2] [--timeout 300] [--log FILE]
stdout: a markdown table, one row a case and configuration, medians over the rounds of the
rounds' medians: eager, CUDA graph and two-stream step, each part (graph), and the routed
experts' FP4 GEMMs alone. --log keeps every run's raw output.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

PARTS = ["attn_proj", "attn_core", "indexer", "moe_route", "experts", "mhc"]


def parse_config(text):
    binary, _, env_text = text.partition(":")
    env = {}
    for item in filter(None, env_text.split(",")):
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"{text!r}: the environment part is NAME=VALUE[,NAME=VALUE...]")
        env[name] = value
    if not os.access(binary, os.X_OK):
        raise ValueError(f"{binary!r}: not an executable file")
    return binary, env


def run_once(binary, env, args):
    cmd = [binary, "--cases", args.cases, "--reps", str(args.reps)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                       env={**os.environ, **env})
    if args.log:
        with open(args.log, "a") as f:
            f.write(f"### {binary} {env} exit {p.returncode}\n{p.stdout}\n{p.stderr}\n")
    if p.returncode != 0:
        sys.exit(f"{binary} {env}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith('{"case"'):
            o = json.loads(line)
            out[o["case"]] = o
    return out


def fmt(v):
    return "-" if v is None or v < 0 else f"{v:.4f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--cases", default="decode_b1,decode_b16,prefill")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run may take")
    ap.add_argument("--log")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 10:
        ap.error("--rounds: 1..10")
    try:
        configs = [parse_config(c) for c in args.configs]
    except ValueError as e:
        ap.error(str(e))
    runs = {i: [] for i in range(len(configs))}
    for _ in range(args.rounds):
        for i, (binary, env) in enumerate(configs):
            runs[i].append(run_once(binary, env, args))

    def med(i, case, get):
        vals = [get(r[case]) for r in runs[i] if case in r]
        vals = [v for v in vals if v is not None and v >= 0]
        return statistics.median(vals) if vals else None

    cases = [c for c in args.cases.split(",") if c]
    print("| case | configuration | eager ms | graph ms | two streams ms | "
          + " | ".join(PARTS) + " | routed FP4 GEMMs ms |")
    print("|---|---|" + "---:|" * (4 + len(PARTS)))
    for case in cases:
        for i, text in enumerate(args.configs):
            cells = [med(i, case, lambda o: o.get("ms")),
                     med(i, case, lambda o: o.get("graph_ms")),
                     med(i, case, lambda o: o.get("graph_streams_ms"))]
            cells += [med(i, case, lambda o, p=p: o["parts"][p].get("graph_ms")) for p in PARTS]
            cells.append(med(i, case, lambda o: o.get("routed_gemms_ms")))
            print(f"| {case} | {text} | " + " | ".join(fmt(v) for v in cells) + " |")


if __name__ == "__main__":
    main()
