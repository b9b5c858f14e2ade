"""plan_packing as a function of its settings: what the command, a notebook and a job call. The
planning is plan()'s; this reads the histograms, runs the algorithms asked for and words the report.

    from bert_packed.packing.pack_settings import PlanSettings
    from bert_packed.packing.plan_command import plan_packing

    report = plan_packing(PlanSettings(histogram="runs/wikipedia_like/unpacked/histogram.json", algorithm="all"))
    [(p.algorithm, p.packing_factor) for p in report.plans]   # one plan per algorithm
    print(report.text())
"""

from __future__ import annotations

import dataclasses
import logging

from bert_packed.errors import SettingsError
from bert_packed.inputs.histogram_file import HistogramError, load_histogram
from bert_packed.packing.histogram import HistogramStats, histogram_stats, sampling_total_variation, total_variation
from bert_packed.packing.pack_settings import PlanSettings
from bert_packed.packing.plan import ALGORITHMS, PackingPlan, plan


@dataclasses.dataclass(frozen=True)
class PlanReport:
    """What plan_packing found.

    Attributes:
      stats: the histogram's figures (padding, the speed-up a perfect packing gives).
      plans: one plan per algorithm asked for, in ALGORITHMS' order.
      comparison: the histogram's mix of lengths against --reference_histogram's
        (compare_with_reference); None without one.
      reference_histogram: the reference's path, as given (None: none).
    """

    stats: HistogramStats
    plans: tuple[PackingPlan, ...]
    comparison: dict | None = None
    reference_histogram: str | None = None

    def to_dict(self) -> dict:
        """The report as --json prints it: one plan's figures and strategies (by algorithm, for
        several), and the comparison under "reference"."""
        payload = self.plans[0].to_dict() if len(self.plans) == 1 else {p.algorithm: p.to_dict() for p in self.plans}
        return payload if self.comparison is None else {**payload, "reference": self.comparison}

    def text(self) -> str:
        """The readable report: the histogram's figures, one row per plan, and the comparison."""
        lines = [format_table(self.stats, self.plans)]
        if self.comparison is not None:
            lines.append(format_comparison(self.comparison, self.reference_histogram))
        return "\n".join(lines)


def plan_packing(settings: PlanSettings) -> PlanReport:
    """Plans a packing of --histogram's sequences with each algorithm asked for.

    With --algorithm=all and an unlimited depth, only the greedy algorithms run (the exact ones
    enumerate the strategies of a finite depth), and a warning says so.

    Args:
      settings: the command's settings; `histogram` is required.

    Returns:
      The PlanReport.

    Raises:
      SettingsError: no histogram given.
      HistogramError: a histogram cannot be read or is bad, or the reference's L differs.
    """
    if not settings.histogram:
        raise SettingsError("--histogram: not given; expected a histogram JSON file (histogram.json of a dataset "
                            "create_pretraining_data made)")
    depth = settings.depth
    algorithms = list(ALGORITHMS) if settings.algorithm == "all" else [settings.algorithm]
    if settings.algorithm == "all" and depth is None:
        algorithms = ["spfhp", "lpfhp"]
        logging.warning("nnlshp and lp enumerate strategies and need a finite --max_sequences_per_pack: left out")
    histogram = load_histogram(settings.histogram, settings.max_sequence_length)
    reference = load_histogram(settings.reference_histogram) if settings.reference_histogram else None
    if reference is not None and len(reference) != len(histogram):
        raise HistogramError(f"--reference_histogram={settings.reference_histogram}: its L is {len(reference)}, "
                             f"{settings.histogram}'s {len(histogram)}: histograms of one L are compared")
    return PlanReport(
        stats=histogram_stats(histogram, depth),
        plans=tuple(plan(histogram, len(histogram), algorithm, depth) for algorithm in algorithms),
        comparison=None if reference is None else compare_with_reference(histogram, reference),
        reference_histogram=settings.reference_histogram)


def format_table(stats: HistogramStats, plans) -> str:
    """The histogram's figures, then one row per plan."""
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


def format_comparison(comparison: dict, reference_path: str | None) -> str:
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
