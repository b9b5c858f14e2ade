import json

import numpy as np
import pytest

from bert_packed.packing import (
    HistogramError,
    check_histogram,
    histogram_from_lengths,
    histogram_stats,
    load_histogram,
    lower_bound_packs,
    merge_histograms,
    save_histogram,
    wikipedia_like_histogram,
)


def test_from_lengths_and_merge_agree_with_concatenation():
    a, b = [1, 5, 5, 8, 3], [8, 8, 2]
    merged = merge_histograms(histogram_from_lengths(a, 8), histogram_from_lengths(b, 8))
    assert merged.tolist() == histogram_from_lengths(a + b, 8).tolist() == [1, 1, 1, 0, 2, 0, 0, 3]


def test_from_lengths_rejects_out_of_range():
    with pytest.raises(HistogramError, match="sequence length 9 is outside"):
        histogram_from_lengths([3, 9], 8)


def test_merge_rejects_different_lengths():
    with pytest.raises(HistogramError, match="different maximum lengths"):
        merge_histograms([1, 2], [1, 2, 3])


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "h.json"
    histogram = np.array([0, 3, 0, 7, 1])
    save_histogram(str(path), histogram)
    assert json.loads(path.read_text()) == {"max_sequence_length": 5, "histogram": [0, 3, 0, 7, 1]}
    assert load_histogram(str(path)).tolist() == [0, 3, 0, 7, 1]
    assert not list(tmp_path.glob("*.tmp*"))


def test_load_bare_list_and_padding_to_l(tmp_path):
    path = tmp_path / "h.json"
    path.write_text("[2, 0, 1]")
    assert load_histogram(str(path)).tolist() == [2, 0, 1]
    assert load_histogram(str(path), max_sequence_length=5).tolist() == [2, 0, 1, 0, 0]
    path.write_text('{"max_sequence_length": 4, "histogram": [1, 2]}')
    assert load_histogram(str(path)).tolist() == [1, 2, 0, 0]


@pytest.mark.parametrize("payload, message", [
    ("[1, -2, 3]", "count for length 2 is -2; counts must be non-negative"),
    ("[1, 2.5]", "count for length 2 is 2.5; expected a whole number"),
    ('[1, "x"]', "count for length 2 is 'x'"),
    ("[0, 0, 0]", "empty"),
    ("[]", "empty"),
    ('{"max_sequence_length": 2, "histogram": [1, 2, 3]}', "longer than the maximum sequence length 2"),
    ('{"counts": [1]}', "expected a JSON object with a 'histogram'"),
    ('{"max_sequence_length": 0, "histogram": [1]}', "max_sequence_length must be >= 1"),
    ('"12"', "expected a list of counts"),
    ("[1, 2", "not valid JSON"),
])
def test_load_rejects_bad_histograms(tmp_path, payload, message):
    path = tmp_path / "bad.json"
    path.write_text(payload)
    with pytest.raises(HistogramError, match=message) as info:
        load_histogram(str(path))
    assert str(path) in str(info.value)


def test_load_missing_file_names_it(tmp_path):
    with pytest.raises(HistogramError, match="nope.json: cannot read"):
        load_histogram(str(tmp_path / "nope.json"))


def test_check_histogram_accepts_whole_floats():
    assert check_histogram([1.0, 2.0]).tolist() == [1, 2]


def test_stats_numbers():
    # L = 10: 4 sequences of length 10, 2 of length 5, 4 of length 1 -> 54 tokens in 100 slots.
    histogram = [4, 0, 0, 0, 2, 0, 0, 0, 0, 4]
    stats = histogram_stats(histogram)
    assert (stats.num_sequences, stats.num_tokens) == (10, 54)
    assert stats.padding_fraction == pytest.approx(0.46)
    assert stats.max_speedup == pytest.approx(100 / 54)
    # Tokens need 6 packs; the four 10s need 4; depth 1 needs one pack per sequence.
    assert stats.lower_bound_packs == 6
    assert lower_bound_packs(histogram, 1) == 10
    assert lower_bound_packs([0, 0, 0, 5, 0, 0, 0, 0]) == 3  # five 4s, L = 8: pairs fit


def test_wikipedia_like_histogram_has_the_asked_shape():
    histogram = wikipedia_like_histogram(1_000_000, 512)
    stats = histogram_stats(histogram)
    assert stats.num_sequences == 1_000_000
    assert stats.padding_fraction == pytest.approx(0.5, abs=1e-3)
    assert histogram[-1] / 1_000_000 == pytest.approx(0.23, abs=1e-6)
    assert (histogram[:-1] > 0).sum() > 400  # spread down to a few tokens
    sampled = wikipedia_like_histogram(1_000_000, 512, seed=1)
    assert sampled.sum() == 1_000_000 and not np.array_equal(sampled, histogram)
    assert histogram_stats(sampled).padding_fraction == pytest.approx(0.5, abs=2e-3)
