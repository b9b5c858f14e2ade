import collections
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_packed.packing import (
    ALGORITHMS,
    PlanError,
    check_strategies,
    histogram_from_lengths,
    lower_bound_packs,
    plan,
    solve_packing_lp,
    wikipedia_like_histogram,
)


def placed_histogram(p):
    """Counts the sequences a plan places, independently of the package's own check."""
    counts = collections.Counter()
    for lengths, count in p.strategies:
        for length in lengths:
            counts[length] += count
    return [counts[length] for length in range(1, p.max_sequence_length + 1)]


def optimal_packs(lengths, max_length, depth):
    """Fewest packs by exhaustive search (a handful of sequences only)."""
    lengths = sorted(lengths, reverse=True)
    best = [len(lengths)]

    def search(i, packs):
        if len(packs) >= best[0]:
            return
        if i == len(lengths):
            best[0] = len(packs)
            return
        tried = set()
        for k, (space, n) in enumerate(packs):
            if lengths[i] <= space and n < depth and (space, n) not in tried:
                tried.add((space, n))
                packs[k] = (space - lengths[i], n + 1)
                search(i + 1, packs)
                packs[k] = (space, n)
        search(i + 1, packs + [(max_length - lengths[i], 1)])

    search(0, [])
    return best[0]


histograms = st.integers(1, 40).flatmap(
    lambda max_length: st.lists(st.integers(0, 30), min_size=max_length, max_size=max_length)
).filter(lambda counts: sum(counts) > 0)


@settings(max_examples=60, deadline=None)
@given(counts=histograms, depth=st.one_of(st.none(), st.integers(1, 5)),
       algorithm=st.sampled_from(sorted(ALGORITHMS)))
def test_every_plan_places_each_sequence_once_within_limits(counts, depth, algorithm):
    if depth is None and algorithm in ("nnlshp", "lp"):
        depth = 4  # these enumerate strategies and need a finite depth
    p = plan(counts, len(counts), algorithm, depth)
    max_depth = len(counts) if depth is None else depth
    assert placed_histogram(p) == list(counts)
    for lengths, count in p.strategies:
        assert count >= 1 and 1 <= len(lengths) <= max_depth and sum(lengths) <= len(counts)
    assert p.num_sequences == sum(counts)
    assert p.num_packs >= p.lower_bound_packs == lower_bound_packs(counts, max_depth)
    assert 0 < p.efficiency <= 1


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 12), min_size=1, max_size=7), depth=st.integers(1, 4))
def test_no_algorithm_beats_the_exhaustive_optimum_and_lp_bound_is_valid(lengths, depth):
    optimum = optimal_packs(lengths, 12, depth)
    histogram = histogram_from_lengths(lengths, 12)
    assert lower_bound_packs(histogram, depth) <= optimum
    lp_bound, _ = solve_packing_lp(histogram, depth)
    assert lp_bound.sum() <= optimum + 1e-6
    for algorithm in ALGORITHMS:
        assert plan(histogram, 12, algorithm, depth).num_packs >= optimum


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60), depth=st.integers(1, 5))
def test_the_lp_over_the_strategies_its_lengths_need_has_the_optimum_of_the_lp_over_all(lengths, depth):
    from bert_packed.packing import exact_fill

    histogram = histogram_from_lengths(lengths, 40)
    counts, strategies = solve_packing_lp(histogram, depth)
    with pytest.MonkeyPatch.context() as every:
        every.setattr(exact_fill, "strategies_for", lambda histogram, columns: np.arange(columns.shape[1]))
        all_counts, all_strategies = solve_packing_lp(histogram, depth)
    assert counts.sum() == pytest.approx(all_counts.sum(), abs=1e-6)
    assert set(strategies) <= set(all_strategies)
    occurring = set(lengths)
    assert all(set(strategy[1:]) <= occurring for strategy in strategies)
    if len(occurring) < 10 and depth > 2:
        assert len(strategies) < len(all_strategies)


@pytest.mark.parametrize("algorithm", [pytest.param(a, marks=pytest.mark.slow) if a == "nnlshp" else a  # NNLS: 4-8 s here
                                       for a in sorted(ALGORITHMS)])
def test_complementary_pairs_pack_perfectly(algorithm):
    # 100 x 300 + 100 x 212 at L = 512: 100 full packs, the optimum.
    histogram = histogram_from_lengths([300] * 100 + [212] * 100, 512)
    p = plan(histogram, 512, algorithm, 3)
    assert p.strategies == (((300, 212), 100),)
    assert p.efficiency == 1.0 and p.packing_factor == 2.0


@pytest.mark.parametrize("algorithm", ["nnlshp", "lp"])
def test_exact_fill_solvers_find_triples(algorithm):
    # L = 12: 40 x (5, 4, 3) is the only perfect packing.
    histogram = histogram_from_lengths([5, 4, 3] * 40, 12)
    p = plan(histogram, 12, algorithm, 3)
    assert p.strategies == (((5, 4, 3), 40),)


def test_lp_reaches_the_optimum_where_greedy_does_not():
    # L = 8, depth 3: 5,5,3,3,1,1,1,1 fit in 3 packs; the greedy walks fill (5, 3) twice first
    # and strand the four 1s in two packs.
    lengths = [5, 5, 3, 3, 1, 1, 1, 1]
    assert optimal_packs(lengths, 8, 3) == 3
    histogram = histogram_from_lengths(lengths, 8)
    assert plan(histogram, 8, "lp", 3).num_packs == 3
    assert plan(histogram, 8, "spfhp", 3).num_packs == 4
    assert plan(histogram, 8, "lpfhp", 3).num_packs == 4


def test_depth_one_gives_one_sequence_per_pack():
    histogram = wikipedia_like_histogram(10_000, 64)
    for algorithm in ALGORITHMS:
        p = plan(histogram, 64, algorithm, 1)
        assert p.num_packs == 10_000 and p.packing_factor == 1.0


def test_greedy_is_near_the_bound_on_wikipedia_like_data_at_unlimited_depth():
    histogram = wikipedia_like_histogram(1_000_000, 512, seed=0)
    for algorithm in ("spfhp", "lpfhp"):
        p = plan(histogram, 512, algorithm, None)
        assert p.num_packs <= 1.003 * p.lower_bound_packs
        assert p.packing_factor == pytest.approx(2.0, abs=0.01)


def test_lp_beats_nnlshp_at_the_same_depth():
    histogram = wikipedia_like_histogram(200_000, 256, seed=0)
    nnls = plan(histogram, 256, "nnlshp", 3)
    lp = plan(histogram, 256, "lp", 3)
    lp_bound, _ = solve_packing_lp(histogram, 3)
    assert nnls.efficiency >= 0.997
    assert lp.num_packs < nnls.num_packs
    assert lp_bound.sum() <= lp.num_packs <= np.ceil(lp_bound.sum()) + 10


@pytest.mark.parametrize("kwargs, message", [
    (dict(algorithm="bogus"), "unknown packing algorithm 'bogus'"),
    (dict(max_sequences_per_pack=0), "max_sequences_per_pack must be an integer >= 1"),
    (dict(max_sequences_per_pack=2.5), "max_sequences_per_pack must be an integer >= 1"),
    (dict(max_sequence_length=2), "longer than the maximum sequence length 2"),
])
def test_plan_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan([1, 2, 3], **kwargs)


def test_nnlshp_refuses_huge_depths():
    with pytest.raises(ValueError, match="nnlshp at L=512 and depth 5"):
        plan([1] * 512, 512, "nnlshp", 5)


def test_strategies_are_counted_exactly_and_counting_stops_past_a_limit():
    from bert_packed.packing import exact_fill

    for length in range(1, 13):
        for depth in range(1, 15):
            assert exact_fill.count_exact_fill_strategies(length, depth) == len(
                exact_fill.exact_fill_strategies(length, depth))
    # Partitions of L into at most 3 parts: round((L + 3)^2 / 12). Counting stops at depth 3, the
    # first past the limit: an (L + 1) x (depth + 1) table had taken 32 GiB here.
    assert exact_fill.count_exact_fill_strategies(65_536, 65_536, limit=1_000_000) == round(65_539**2 / 12)


@pytest.mark.parametrize("algorithm", ["nnlshp", "lp"])
def test_the_exact_fill_columns_are_made_once_for_every_histogram_of_their_length_and_depth(algorithm):
    from bert_packed.packing.exact_fill import exact_fill_columns

    exact_fill_columns.cache_clear()
    first, second = (histogram_from_lengths(lengths, 12) for lengths in ([5, 4, 3] * 40, [6, 6, 1, 11] * 7))
    plans = [plan(histogram, 12, algorithm, 3).strategies for histogram in (first, second)]
    assert exact_fill_columns.cache_info()[:2] == (1, 1)  # a hit, a miss
    exact_fill_columns.cache_clear()
    assert [plan(histogram, 12, algorithm, 3).strategies for histogram in (first, second)] == plans  # made afresh


def test_the_lp_never_fails_in_the_solver_it_falls_back_saying_what_it_did(monkeypatch, caplog):
    """Beyond its column limit it solves a shallower LP (its packs are valid deeper) and keeps
    that or LPFHP's plan, the fewer packs; when HiGHS fails, its other method, then LPFHP."""
    import scipy.optimize

    from bert_packed.packing import exact_fill

    histogram = wikipedia_like_histogram(5_000, 64, seed=1)
    counts = [exact_fill.count_exact_fill_strategies(64, d) for d in (3, 4, 5)]
    assert counts == [374, 2_280, 9_027]
    monkeypatch.setattr(exact_fill, "MAX_LP_STRATEGIES", 3_000)
    deep = plan(histogram, 64, "lp", 5)
    assert ("lp at L=64 and depth 5 would have over 3,000 strategies (9,027 at depth 5): solved at depth 4 instead"
            in caplog.text)
    at_four = plan(histogram, 64, "lp", 4)
    assert deep.num_packs == min(at_four.num_packs, plan(histogram, 64, "lpfhp", 5).num_packs)
    assert deep.max_sequences_per_pack == 5 and max(len(lengths) for lengths, _ in deep.strategies) <= 5

    solve = scipy.optimize.linprog
    methods = []

    def failing(*args, method, **kwargs):
        methods.append(method)
        result = solve(*args, method=method, **kwargs)
        result.status, result.message = 4, "HiGHS Status 4: Solve error"
        return result

    monkeypatch.setattr(scipy.optimize, "linprog", failing)
    caplog.clear()
    fallen = plan(histogram, 64, "lp", 3)
    assert methods == ["highs-ipm", "highs-ds"]
    assert re.search(r"HiGHS's highs-ipm stopped \(HiGHS Status 4: Solve error\); solving it with highs-ds",
                     caplog.text)
    assert "the packing LP at depth 3 did not solve (HiGHS Status 4: Solve error); packed with lpfhp at depth 3 " \
           "instead" in caplog.text
    assert fallen.strategies == plan(histogram, 64, "lpfhp", 3).strategies


def test_check_strategies_catches_lost_duplicated_and_oversized_sequences():
    histogram = np.array([2, 0, 1, 0])
    check_strategies([((3, 1), 1), ((1,), 1)], histogram, depth=2)
    with pytest.raises(PlanError, match="places 1 sequences of length 1, the histogram has 2"):
        check_strategies([((3, 1), 1)], histogram, depth=2)
    with pytest.raises(PlanError, match="places 3 sequences of length 1"):
        check_strategies([((3, 1), 1), ((1, 1), 1)], histogram, depth=2)
    with pytest.raises(PlanError, match="invalid strategy"):
        check_strategies([((3, 1, 1), 1)], histogram, depth=2)
    with pytest.raises(PlanError, match="invalid strategy"):
        check_strategies([((3, 3), 1)], np.array([0, 0, 2]), depth=2)
