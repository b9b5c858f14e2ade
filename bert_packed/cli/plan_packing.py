"""Plan a packing from a length histogram and report it.

    python -m bert_packed.packing --histogram H.json --algorithm lp --max_sequences_per_pack 3
    bert-packed-plan --histogram H.json --algorithm all --json

--max-sequences-per-pack and --max-sequence-length are aliases of the underscored flags. Exit
status 2 with a one-line message on bad input.
"""

from __future__ import annotations

import json
import logging
import sys

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.packing import (
    ALGORITHMS,
    HistogramError,
    histogram_stats,
    load_histogram,
    plan,
    sampling_total_variation,
    total_variation,
)
from bert_packed.packing.pack_settings import PlanSettings
from bert_packed.settings import help_groups

FLAGS = flags.FLAGS
SETTINGS = (PlanSettings,)
define_flags(*SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)
flags.mark_flag_as_required("histogram")

PROGRAM = "plan_packing"


def format_table(stats, plans) -> str:
    """The readable report: histogram figures, then one row per plan."""
    lines = [
        f"sequences {stats.num_sequences:,}   tokens {stats.num_tokens:,}   "
        f"L {stats.max_sequence_length}   padding unpacked {stats.padding_fraction:.2%}   "
        f"max speed-up {stats.max_speedup:.3f}x",
        "",
        f"{'algorithm':<10}{'depth':>7}{'packs':>14}{'lower bound':>14}{'gap':>9}"
        f"{'efficiency':>13}{'packing factor':>16}{'strategies':>12}{'seconds':>10}",
    ]
    for p in plans:
        gap = p.num_packs / p.lower_bound_packs - 1.0
        depth = "inf" if p.max_sequences_per_pack is None else str(p.max_sequences_per_pack)
        lines.append(
            f"{p.algorithm:<10}{depth:>7}{p.num_packs:>14,}{p.lower_bound_packs:>14,}{gap:>9.3%}"
            f"{_percent(p.efficiency):>13}{p.packing_factor:>16.4f}{len(p.strategies):>12,}{p.seconds:>10.3f}")
    return "\n".join(lines)


def compare_with_reference(histogram, reference) -> dict:
    """How far `histogram`'s mix of lengths is from `reference`'s (of the same L)."""
    stats, reference_stats = histogram_stats(histogram), histogram_stats(reference)
    return {
        "padding_fraction": [stats.padding_fraction, reference_stats.padding_fraction],
        "full_length_fraction": [histogram[-1] / stats.num_sequences, reference[-1] / reference_stats.num_sequences],
        "max_speedup": [stats.max_speedup, reference_stats.max_speedup],
        "total_variation": total_variation(histogram, reference),
        "total_variation_16_token_bins": total_variation(histogram, reference, bin_width=16),
        # What the same number of lengths drawn from the reference itself is off by.
        "sample_total_variation": sampling_total_variation(reference, stats.num_sequences),
    }


def format_comparison(comparison: dict, reference_path: str) -> str:
    """The comparison's lines: this histogram's figures, the reference's in brackets."""
    c = comparison
    return "\n".join([
        f"against {reference_path} (in brackets): padding {c['padding_fraction'][0]:.1%} "
        f"({c['padding_fraction'][1]:.1%}), exactly L long {c['full_length_fraction'][0]:.1%} "
        f"({c['full_length_fraction'][1]:.1%}), max speed-up {c['max_speedup'][0]:.3f}x ({c['max_speedup'][1]:.3f}x)",
        f"total-variation distance {c['total_variation']:.3f} per length, {c['total_variation_16_token_bins']:.3f} in "
        f"16-token bins; as many lengths drawn from the reference itself are {c['sample_total_variation']:.3f} "
        f"off per length",
    ])


def _percent(fraction: float) -> str:
    """A percentage with as many decimals as it takes not to round up to 100% (4 at most).

    >>> _percent(0.999997), _percent(0.9)
    ('99.9997%', '90.000%')
    """
    for decimals in (3, 4):
        text = f"{fraction:.{decimals}%}"
        if fraction >= 1.0 or not text.startswith("100"):
            return text
    return text


def main(argv) -> None:
    del argv
    depth = from_flags(PlanSettings).depth
    algorithms = list(ALGORITHMS) if FLAGS.algorithm == "all" else [FLAGS.algorithm]
    if FLAGS.algorithm == "all" and depth is None:
        algorithms = ["spfhp", "lpfhp"]
        logging.warning("nnlshp and lp enumerate strategies and need a finite --max_sequences_per_pack: left out")
    histogram = load_histogram(FLAGS.histogram, FLAGS.max_sequence_length)
    reference = load_histogram(FLAGS.reference_histogram) if FLAGS.reference_histogram else None
    if reference is not None and len(reference) != len(histogram):
        raise HistogramError(f"--reference_histogram={FLAGS.reference_histogram}: its L is {len(reference)}, "
                             f"{FLAGS.histogram}'s {len(histogram)}: histograms of one L are compared")
    plans = [plan(histogram, len(histogram), algorithm, depth) for algorithm in algorithms]
    comparison = None if reference is None else compare_with_reference(histogram, reference)
    if FLAGS.json:
        payload = plans[0].to_dict() if len(plans) == 1 else {p.algorithm: p.to_dict() for p in plans}
        json.dump(payload if comparison is None else {**payload, "reference": comparison}, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(histogram_stats(histogram, depth), plans))
        if comparison is not None:
            print(format_comparison(comparison, FLAGS.reference_histogram))


def entry_point():
    run(main, PROGRAM, "histogram", "Nothing was written")


if __name__ == "__main__":
    entry_point()
