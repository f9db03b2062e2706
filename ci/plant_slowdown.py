"""Plant a known slowdown into a tree, to check that the gate catches it (and only it) on a GPU.

    python ci/plant_slowdown.py verify [--min-keys 32768] [--every 3] [--root DIR]
    python ci/plant_slowdown.py topk [--root DIR]

verify: edits kernels/verify/triton_verify.py: for caches of at least `--min-keys` keys, every
`--every`-th call of the Triton tree-verify kernel launches its split kernel twice. Under a CUDA
graph the extra launch is captured once and replayed every step, so a 32k-context Triton cell
gets a fixed share of extra verify work while SDPA cells and short contexts are untouched: the
gate must call exactly the long-context Triton cells of scenarios/pr.yaml regressed.

topk: edits kernels/tree/triton_topk.py: every call of the Triton top-k does its work twice (a
2x slowdown of that kernel, nothing else): the gate must call exactly the `topk_impl: triton`
cells of scenarios/ops.yaml regressed.

Run it in a throwaway checkout or a copy (`--root`, default this checkout); `git checkout
kernels/` undoes it. The A/B gate's head is the working tree (`harness gate SCENARIO --base
HEAD`); a batch host runs the copy (`python -m harness.worker --cells ...` from it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MARK = "PLANTED_SLOWDOWN"
VERIFY = Path("kernels") / "verify" / "triton_verify.py"
VERIFY_ANCHOR = "    _combine_kernel[(triton.cdiv(T * p[\"G\"], p[\"COMBINE_ROWS\"]), b * hkv)]("
VERIFY_SPLIT_CALL = "    _split_kernel[(p[\"m_tiles\"], p[\"num_splits\"] + 1, b * hkv)]("
TOPK = Path("kernels") / "tree" / "triton_topk.py"
TOPK_DEF = "\ndef topk_logprobs("


class Moved(Exception):
    """The code the plant edits is not where this script expects it."""


def plant_verify(text: str, min_keys: int, every: int) -> str:
    start, end = text.find(VERIFY_SPLIT_CALL), text.find(VERIFY_ANCHOR)
    if start < 0 or end < start:
        raise Moved("the split-kernel launch moved")
    launch = text[start:end]
    extra = "".join("    " + line if line.strip() else line for line in launch.splitlines(True))
    planted = (f"    global {MARK}\n    {MARK} += 1\n"
               f"    if S >= {min_keys} and {MARK} % {every} == 0:\n{extra}")
    text = text[:end] + planted + text[end:]
    return text.replace("\ndef tree_verify_attention(", f"\n{MARK} = 0\n\n\ndef tree_verify_attention(", 1)


def plant_topk(text: str) -> str:
    if text.count(TOPK_DEF) != 1:
        raise Moved("topk_logprobs is not defined exactly once")
    text = text.replace(TOPK_DEF, "\ndef _topk_logprobs_once(")
    return text + f'''

{MARK} = "every call of topk_logprobs does its work twice"


def topk_logprobs(logits, k, out=None, workspace=None, config=None):
    _topk_logprobs_once(logits, k, out=out, workspace=workspace, config=config)
    return _topk_logprobs_once(logits, k, out=out, workspace=workspace, config=config)
'''


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", choices=("verify", "topk"))
    ap.add_argument("--min-keys", type=int, default=32768, help="verify: caches this long or longer")
    ap.add_argument("--every", type=int, default=3, help="verify: one call in this many")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args(argv)
    path = args.root / (VERIFY if args.kernel == "verify" else TOPK)
    text = path.read_text()
    if MARK in text:
        print(f"{path}: already planted", file=sys.stderr)
        return 1
    try:
        text = (plant_verify(text, args.min_keys, args.every) if args.kernel == "verify"
                else plant_topk(text))
    except Moved as e:
        print(f"{path}: {e}; update ci/plant_slowdown.py", file=sys.stderr)
        return 2
    path.write_text(text)
    what = (f"1 in {args.every} Triton verify calls over >= {args.min_keys} keys runs its split "
            f"kernel twice" if args.kernel == "verify" else "every Triton top-k call runs twice")
    print(f"planted: {what} ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
