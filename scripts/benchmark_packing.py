"""Benchmark the packing planner on Wikipedia-like length histograms.

    python scripts/benchmark_packing.py            # the README's table (about 2 minutes)

For each histogram and algorithm: packs, the lower bound, efficiency, packing factor and the
median time of `--repeats` runs. Then the issue's targets, each marked PASS or FAIL:
- SPFHP and LPFHP under 0.1 s at L=512 and, at unlimited depth, within 0.3% of the lower bound;
- NNLSHP at depth 3 >= 99.7% efficient at L=512 in under 30 s;
- LP more efficient than NNLSHP at depth 3, in under 5 s;
- cost independent of N: 1M and 16.3M sequences take about the same time.
"""

from __future__ import annotations

import statistics
import sys

from absl import flags

from bert_packed.cli.common import run
from bert_packed.packing import histogram_stats, plan, solve_packing_lp, wikipedia_like_histogram
from bert_packed.packing.exact_fill import exact_fill_columns

FLAGS = flags.FlagValues()
flags.DEFINE_integer("repeats", 3, "Runs per fast algorithm (median reported).", lower_bound=1, flag_values=FLAGS)

PROGRAM = "benchmark_packing"

RUNS = [  # (algorithm, depth); None = unlimited
    ("spfhp", None), ("lpfhp", None), ("spfhp", 3), ("lpfhp", 3), ("nnlshp", 3), ("lp", 3),
]


def datasets():
    """(name, L, histogram): Wikipedia at 512 (50% padding, 23% full) and the milder 128."""
    yield "wiki-512 16.3M", 512, wikipedia_like_histogram(16_300_000, 512, seed=0)
    yield "wiki-512 1M", 512, wikipedia_like_histogram(1_000_000, 512, seed=0)
    yield "wiki-512 10k", 512, wikipedia_like_histogram(10_000, 512, seed=0)
    yield "wiki-128 16.3M", 128, wikipedia_like_histogram(16_300_000, 128, full_fraction=0.6,
                                                         padding_fraction=0.15, seed=0)


def timed_plan(histogram, max_length, algorithm, depth, repeats):
    plans = []
    for _ in range(repeats):
        exact_fill_columns.cache_clear()  # each plan as a command's one plan pays it: columns made too
        plans.append(plan(histogram, max_length, algorithm, depth))
    return plans[0], statistics.median(p.seconds for p in plans)


def main(argv) -> int:
    """Returns the exit status: 1 when a target is missed."""
    del argv
    rows = {}
    print("| data | padding | algorithm | depth | packs | lower bound | LP bound | gap | efficiency "
          "| packing factor | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, max_length, histogram in datasets():
        stats = histogram_stats(histogram)
        lp_bound = solve_packing_lp(histogram, 3)[0].sum()  # no packing at depth 3 needs fewer
        for algorithm, depth in RUNS:
            repeats = 1 if algorithm in ("nnlshp", "lp") else FLAGS.repeats
            p, seconds = timed_plan(histogram, max_length, algorithm, depth, repeats)
            rows[(name, algorithm, depth)] = (p, seconds)
            bound = f"{lp_bound:,.1f}" if depth == 3 else ""
            print(f"| {name} | {stats.padding_fraction:.1%} | {algorithm} | {depth or 'inf'} | {p.num_packs:,} "
                  f"| {p.lower_bound_packs:,} | {bound} | {p.num_packs / p.lower_bound_packs - 1:.4%} "
                  f"| {p.efficiency:.4%} | {p.packing_factor:.4f} | {seconds:.3f} |")
        sys.stdout.flush()

    checks = []
    for algorithm in ("spfhp", "lpfhp"):
        for name in ("wiki-512 16.3M", "wiki-512 1M", "wiki-512 10k"):
            for depth in (None, 3):
                p, seconds = rows[(name, algorithm, depth)]
                checks.append((f"{algorithm} {name} depth {depth or 'inf'}: {seconds:.4f} s < 0.1 s", seconds < 0.1))
            p, _ = rows[(name, algorithm, None)]
            gap = p.num_packs / p.lower_bound_packs - 1
            checks.append((f"{algorithm} {name} unlimited depth: {gap:.4%} above the lower bound <= 0.3%", gap <= 0.003))
    for name in ("wiki-512 16.3M", "wiki-512 1M"):
        nnls, nnls_seconds = rows[(name, "nnlshp", 3)]
        lp, lp_seconds = rows[(name, "lp", 3)]
        checks.append((f"nnlshp {name} depth 3: {nnls.efficiency:.4%} >= 99.7%", nnls.efficiency >= 0.997))
        checks.append((f"nnlshp {name} depth 3: {nnls_seconds:.1f} s < 30 s", nnls_seconds < 30))
        checks.append((f"lp {name} depth 3: {lp.num_packs:,} packs < nnlshp {nnls.num_packs:,}",
                       lp.num_packs < nnls.num_packs))
        checks.append((f"lp {name} depth 3: {lp_seconds:.2f} s < 5 s", lp_seconds < 5))
    for algorithm, depth in RUNS:
        small = rows[("wiki-512 1M", algorithm, depth)][1]
        large = rows[("wiki-512 16.3M", algorithm, depth)][1]
        ratio = large / small
        checks.append((f"{algorithm} depth {depth or 'inf'}: 16.3M / 1M sequences time ratio {ratio:.2f} "
                       f"(independent of N: within 0.5-2x)", 0.5 <= ratio <= 2.0))
    print()
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    run(main, PROGRAM, (), "Nothing was written", flag_values=FLAGS)
