#!/usr/bin/env python3
"""Prepares the corpus of frink's demo model (models/frink-demo.gguf) from the King James
Bible of Debian's bible-kjv package (text in bible-kjv-text; public domain, see
models/README.md).

    apt-get install -y bible-kjv
    python3 tools/prepare_demo_corpus.py --out .fixtures/corpus

writes OUT/train.txt (the first ~95%) and OUT/heldout.txt (the last ~5%, contiguous, cut at
the first chapter heading past 95% of the bytes, so it starts with "Book N"). The text is
laid out as

    Genesis 1
    <blank>
    In the beginning God created the heaven and the earth.
    And the earth was without form, ...
    <blank>
    Genesis 2
    ...

one verse a line, verse numbers dropped. The output is a pure function of the package's data
(bible -l 100000 Gen1:1-Rev22:21 prints every verse unwrapped), so reruns give the same bytes.
"""
import argparse
import hashlib
import os
import re
import subprocess
import sys

HELDOUT_FRACTION = 0.05
HEADING = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]* \d+$")  # "Genesis 1", "1 Samuel 3"
VERSE = re.compile(r"^\s+\d+ (.*)$")                       # "  12 And God said, ..."


def kjv_text(bible: str) -> str:
    raw = subprocess.run([bible, "-l", "100000", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         text=True, encoding="ascii").stdout
    out = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        if HEADING.match(line):
            if out:
                out.append("")
            out += [line, ""]
            continue
        m = VERSE.match(line)
        if not m:
            sys.exit(f"prepare_demo_corpus: unexpected line from {bible}: {line!r}")
        out.append(m.group(1).strip())
    return "\n".join(out) + "\n"


def split_heldout(text: str) -> tuple[str, str]:
    """[0, cut) trains, [cut, end) is held out; cut is the start of the first chapter heading
    at or past (1 - HELDOUT_FRACTION) of the text."""
    target = int(len(text) * (1 - HELDOUT_FRACTION))
    for m in re.finditer(r"\n\n((?:[1-3] )?[A-Z][A-Za-z ]* \d+)\n\n", text):
        if m.start(1) >= target:
            return text[: m.start(1)], text[m.start(1):]
    sys.exit("prepare_demo_corpus: no chapter heading past the split point")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for train.txt and heldout.txt")
    ap.add_argument("--bible", default="bible", help="the bible program (package bible-kjv)")
    a = ap.parse_args()
    text = kjv_text(a.bible)
    train, heldout = split_heldout(text)
    os.makedirs(a.out, exist_ok=True)
    for name, part in (("train.txt", train), ("heldout.txt", heldout)):
        with open(os.path.join(a.out, name), "w", encoding="ascii", newline="\n") as f:
            f.write(part)
        digest = hashlib.sha256(part.encode("ascii")).hexdigest()
        print(f"{name}: {len(part)} bytes, {part.count(chr(10))} lines, sha256 {digest}")


if __name__ == "__main__":
    main()
