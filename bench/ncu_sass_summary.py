#!/usr/bin/env python3
"""Summary of the per-instruction SASS CSV that bench/ncu_layer.sh --sass writes (Nsight
Compute's source page: each instruction's executions and warp stall samples by reason).

  bench/ncu_sass_summary.py CSV[.gz] [--top N]

For each kernel in the file: the warp instructions executed and the MMA instructions among them,
the instruction mix by opcode, the stall samples by reason and by opcode, and the N instructions
holding the most stall samples with their two leading reasons. An instruction's samples show
where warps wait, not what they wait for: session 34 read the decode's FP4 products as waiting
on one register copy, and session 35, the copy gone, found the same waits on the next use of
the loads (bench/RESULTS.md).
"""
import argparse
import collections
import csv
import gzip
import re


def read_kernels(path):
    """[(kernel name, [row dict, ...])] in file order"""
    opener = gzip.open if path.endswith(".gz") else open
    kernels, header = [], None
    with opener(path, "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append((row[1], []))
                header = None
            elif row[0] == "Address":
                header = row
            elif header and kernels:
                kernels[-1][1].append(dict(zip(header, row)))
    return kernels


def num(text):
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(source):
    m = re.match(r"\s*(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", source)
    return m.group(1) if m else source.strip()[:12]


def summarize(name, rows, top):
    print("=" * 100)
    print(name[:200])
    if not rows:
        print("(no instructions)")
        return
    reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    executed, stalled, by_reason = collections.Counter(), collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        executed[op] += num(r["Instructions Executed"])
        stalled[op] += num(r["Warp Stall Sampling (All Samples)"])
        for c in reasons:
            by_reason[c] += num(r[c])
    total_ex = sum(executed.values()) or 1.0
    total_st = sum(stalled.values()) or 1.0
    mma = executed.get("HGMMA", 0) + executed.get("HMMA", 0)
    print(f"warp instructions executed {total_ex:.4g}, of them MMA {mma:.4g}; "
          f"stall samples {total_st:.4g}")
    print("mix:", ", ".join(f"{o} {v / total_ex:.1%}" for o, v in executed.most_common(16)))
    print("stalls by reason:",
          ", ".join(f"{c[6:]} {v / total_st:.1%}" for c, v in by_reason.most_common(10)))
    print("stalls by opcode:", ", ".join(f"{o} {v / total_st:.1%}" for o, v in stalled.most_common(12)))
    hot = sorted(rows, key=lambda r: -num(r["Warp Stall Sampling (All Samples)"]))[:top]
    for r in hot:
        lead = sorted(((num(r[c]), c[6:]) for c in reasons), reverse=True)[:2]
        share = num(r["Warp Stall Sampling (All Samples)"]) / total_st
        print(f"  {share:6.1%} executed {num(r['Instructions Executed']):9.3g}  "
              f"{r['Address'][-6:]}  {r['Source'].strip()[:64]:64s}  "
              f"{' '.join(x[1] for x in lead)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu_layer.sh --sass output (.csv or .csv.gz)")
    ap.add_argument("--top", type=int, default=20, help="hottest instructions to list")
    args = ap.parse_args()
    for name, rows in read_kernels(args.csv):
        summarize(name, rows, args.top)


if __name__ == "__main__":
    main()
