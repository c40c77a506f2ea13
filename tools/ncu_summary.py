#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name (device machine).

Usage: ncu_summary.py NCU.csv [--grid]   -> a table of total / count / mean microseconds per kernel,
largest first, and the grand total. Used to see where a decode token's time goes."""
import csv, sys, collections, signal

# Piped into head (gpu_run.sh does), stop quietly when the reader has had enough.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1000 if unit in ("ns", "nsecond") else v * 1000 if unit in ("ms", "msecond") else v
    name = r["Kernel Name"].split("(")[0][:70]
    rows.append((name, r.get("Grid Size", ""), us))
tot = collections.defaultdict(float)
cnt = collections.Counter()
by_grid = "--grid" in sys.argv  # one row per kernel and grid: tells wq from w_down
for name, grid, us in rows:
    if by_grid:
        name = f"{name[:52]} {grid}"
    tot[name] += us
    cnt[name] += 1
all_us = sum(tot.values())
print(f"{'kernel':70s} {'total us':>10s} {'n':>6s} {'mean us':>9s} {'share':>6s}")
for name, us in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f"{name:70s} {us:10.1f} {cnt[name]:6d} {us / cnt[name]:9.2f} {100 * us / all_us:5.1f}%")
print(f"{'all kernels':70s} {all_us:10.1f} {len(rows):6d}")
