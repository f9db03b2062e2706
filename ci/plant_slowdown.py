"""Plant a known slowdown into this working tree, to check that the gate catches it on a GPU.

    python ci/plant_slowdown.py [--min-keys 32768] [--every 3]

Edits kernels/verify/triton_verify.py in place: for caches of at least `--min-keys` keys, every
`--every`-th call of the Triton tree-verify kernel launches its split kernel twice. Under a CUDA
graph the extra launch is captured once and replayed every step, so a 32k-context Triton cell
gets a fixed share of extra verify work while SDPA cells and short contexts are untouched: the
gate must call exactly the long-context Triton cells regressed. Run it in a throwaway checkout
(the gate's head is the working tree: `harness gate scenarios/pr.yaml --base HEAD`); `git
checkout kernels/verify/triton_verify.py` undoes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "kernels" / "triton_verify.py"
ANCHOR = "    _combine_kernel[(triton.cdiv(T * p[\"G\"], p[\"COMBINE_ROWS\"]), b * hkv)]("
SPLIT_CALL_START = "    _split_kernel[(p[\"m_tiles\"], p[\"num_splits\"] + 1, b * hkv)]("


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-keys", type=int, default=32768)
    ap.add_argument("--every", type=int, default=3)
    args = ap.parse_args(argv)
    text = KERNEL.read_text()
    if "PLANTED_SLOWDOWN" in text:
        print(f"{KERNEL.relative_to(ROOT)}: already planted", file=sys.stderr)
        return 1
    start = text.find(SPLIT_CALL_START)
    end = text.find(ANCHOR)
    if start < 0 or end < start:
        print(f"{KERNEL.relative_to(ROOT)}: the split-kernel launch moved; update ci/plant_slowdown.py", file=sys.stderr)
        return 2
    launch = text[start:end]
    extra = "".join("    " + line if line.strip() else line for line in launch.splitlines(True))
    planted = (f"    global PLANTED_SLOWDOWN\n    PLANTED_SLOWDOWN += 1\n"
               f"    if S >= {args.min_keys} and PLANTED_SLOWDOWN % {args.every} == 0:\n{extra}")
    text = text[:end] + planted + text[end:]
    text = text.replace("\ndef tree_verify_attention(", "\nPLANTED_SLOWDOWN = 0\n\n\ndef tree_verify_attention(", 1)
    KERNEL.write_text(text)
    print(f"planted: 1 in {args.every} Triton verify calls over >= {args.min_keys} keys "
          f"runs its split kernel twice ({KERNEL.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
