#!/usr/bin/env python3
"""Which kernels of two PTX files differ, labels and mangled names aside.

Device time is scarce, and ptxas's register allocation moves with source changes that look
neutral (one pointer expression took the decode attention kernels from 124 to 72 registers and
changed their speed), so a refactor that claims to leave a kernel alone is checked here, on the
dev machine, by its PTX:

  nvcc ... -arch=sm_90 -ptx old.cu -o old.ptx      # e.g. from `git show REV:src/cuda/x.cu`
  nvcc ... -arch=sm_90 -ptx src/cuda/x.cu -o new.ptx
  tools/ptx_diff.py old.ptx new.ptx [--pair OLD_SUBSTRING=NEW_SUBSTRING ...]

Kernels pair by demangled-free name: the same mangled name after the anonymous namespace's
hash is dropped, or the pairs given (a kernel that became a template instance). Prints each
pair as identical or with its count of differing lines.
"""
import argparse
import difflib
import re


def entries(path):
    text = open(path).read()
    out = {}
    for part in re.split(r"\n(?=\.(?:visible|weak)?\s*\.entry|\.entry)", text):
        m = re.search(r"\.entry\s+(\S+?)\(", part)
        if m:
            out[m.group(1)] = part
    return out


def key(name):
    return re.sub(r"\d+_GLOBAL__N__\w+?_cu_[0-9a-f]{8}", "ANON", name)


def clean(body):
    body = re.sub(r"_ZZ?N\S+?(?=_param|\(|\[|;|,|\s)", "SYM", body)  # mangled names, with the file's hash
    return re.sub(r"\$L__BB\d+_", "$L_", body)  # block labels number kernels in file order


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--pair", action="append", default=[], help="OLD_SUBSTRING=NEW_SUBSTRING")
    a = ap.parse_args()
    old, new = entries(a.old), entries(a.new)
    pairs = []
    for spec in a.pair:
        o, n = spec.split("=", 1)
        pairs += [(x, y) for x in old if o in x for y in new if n in y]
    by_key = {key(n): n for n in new}
    pairs += [(o, by_key[key(o)]) for o in old if key(o) in by_key]
    for o, n in pairs:
        d = [l for l in difflib.unified_diff(clean(old[o]).splitlines(), clean(new[n]).splitlines(), lineterm="", n=0)
             if l[:1] in "+-" and l[:3] not in ("+++", "---") and l.strip() not in "+-"]
        print(f"{'identical' if not d else f'{len(d)} lines differ'}: {o} -> {n}")


if __name__ == "__main__":
    main()
