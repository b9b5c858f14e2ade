"""Histogram packing planner: NumPy/SciPy only (never imports TensorFlow).

    from bert_packed.packing import plan, load_histogram
    p = plan(load_histogram("histogram.json"), algorithm="lp", max_sequences_per_pack=3)
    p.num_packs, p.efficiency, p.strategies
"""

from bert_packed.inputs.histogram_file import HistogramError, check_histogram, load_histogram, save_histogram
from bert_packed.packing.exact_fill import lp_packing, nnlshp, solve_packing_lp
from bert_packed.packing.greedy import lpfhp, spfhp
from bert_packed.packing.histogram import (
    HistogramStats,
    histogram_from_lengths,
    histogram_stats,
    lower_bound_packs,
    merge_histograms,
    sampling_total_variation,
    total_variation,
)
from bert_packed.packing.online import OnlinePacker
from bert_packed.packing.plan import ALGORITHMS, DEFAULT_ALGORITHM, PackingPlan, PlanError, check_strategies, plan
from bert_packed.packing.synthetic import wikipedia_like_histogram

__all__ = [
    "ALGORITHMS", "DEFAULT_ALGORITHM", "HistogramError", "HistogramStats", "OnlinePacker", "PackingPlan", "PlanError",
    "check_histogram", "check_strategies", "histogram_from_lengths", "histogram_stats", "load_histogram",
    "lower_bound_packs", "lp_packing", "lpfhp", "merge_histograms", "nnlshp", "plan",
    "sampling_total_variation", "save_histogram", "solve_packing_lp", "spfhp", "total_variation",
    "wikipedia_like_histogram",
]
