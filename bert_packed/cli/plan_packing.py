"""Plan a packing from a length histogram and report it.

    python -m bert_packed.packing --histogram H.json --algorithm lp --max-sequences-per-pack 3
    python -m bert_packed.packing --histogram H.json --algorithm all --json

Exit status 2 with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from bert_packed.packing import ALGORITHMS, HistogramError, histogram_stats, load_histogram, plan


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block: the message says what is wrong
        self.exit(2, f"{self.prog}: error: {message}\n")


def _depth(text: str) -> int | None:
    if text.lower() in ("none", "unlimited"):
        return None
    try:
        depth = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'unlimited', got {text!r}") from None
    if depth < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (or 'unlimited'), got {depth}")
    return depth


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m bert_packed.packing", description=__doc__.split("\n")[0])
    parser.add_argument("--histogram", required=True,
                        help="histogram JSON: {'max_sequence_length': L, 'histogram': [c_1..c_L]} or a list")
    parser.add_argument("--algorithm", default="lpfhp", choices=[*ALGORITHMS, "all"],
                        help="packing algorithm, or 'all' to compare them side by side (default lpfhp)")
    parser.add_argument("--max-sequences-per-pack", type=_depth, default=3,
                        help="depth: at most this many sequences per pack, or 'unlimited' (default 3)")
    parser.add_argument("--max-sequence-length", type=int, default=None,
                        help="L; default: the histogram file's max_sequence_length (or its length)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (with the strategies) instead of a table")
    return parser


def format_table(stats, plans) -> str:
    """The readable report: histogram figures, then one row per plan."""
    lines = [
        f"sequences {stats.num_sequences:,}   tokens {stats.num_tokens:,}   "
        f"L {stats.max_sequence_length}   padding when unpadded {stats.padding_fraction:.2%}   "
        f"max speed-up {stats.max_speedup:.3f}x",
        "",
        f"{'algorithm':<10}{'depth':>7}{'packs':>14}{'lower bound':>14}{'gap':>9}"
        f"{'efficiency':>12}{'packing factor':>16}{'strategies':>12}{'seconds':>10}",
    ]
    for p in plans:
        gap = p.num_packs / p.lower_bound_packs - 1.0
        depth = "inf" if p.max_sequences_per_pack is None else str(p.max_sequences_per_pack)
        lines.append(
            f"{p.algorithm:<10}{depth:>7}{p.num_packs:>14,}{p.lower_bound_packs:>14,}{gap:>9.3%}"
            f"{p.efficiency:>12.3%}{p.packing_factor:>16.4f}{len(p.strategies):>12,}{p.seconds:>10.3f}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    algorithms = list(ALGORITHMS) if args.algorithm == "all" else [args.algorithm]
    if args.algorithm == "all" and args.max_sequences_per_pack is None:
        # The strategy-enumerating solvers need a finite depth.
        algorithms = ["spfhp", "lpfhp"]
    try:
        histogram = load_histogram(args.histogram, args.max_sequence_length)
        plans = [plan(histogram, len(histogram), algorithm, args.max_sequences_per_pack)
                 for algorithm in algorithms]
    except (HistogramError, ValueError) as e:
        parser.error(str(e))
    if args.json:
        payload = plans[0].to_dict() if len(plans) == 1 else {p.algorithm: p.to_dict() for p in plans}
        json.dump(payload, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(histogram_stats(histogram, args.max_sequences_per_pack), plans))


if __name__ == "__main__":
    main()
