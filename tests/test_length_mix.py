"""The Wikipedia-like corpus: articles cut into documents of a log-normal mix of lengths, every
sentence once and in order; the length mix compared with a reference histogram."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REAL_VOCAB, REPO, run_command

from bert_packed.errors import OutputDirectoryError
from bert_packed.packing import load_histogram, sampling_total_variation, total_variation
from bert_packed.pretraining_data.corpus import read_documents
from bert_packed.pretraining_data.length_mix import corpus_text, cut_article, write_once
from bert_packed.pretraining_data.tokenization import Tokenizer

WIKIPEDIA_512 = os.path.join(REPO, "data", "histograms", "wikipedia_512.json")


@pytest.mark.parametrize("seed", range(5))
def test_cut_article_keeps_every_sentence_once_in_documents_near_their_targets(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 80, size=200).tolist()
    targets = rng.integers(1, 600, size=200)
    sizes = cut_article(lengths, iter(targets))
    assert sum(sizes) == len(lengths) and min(sizes) >= 1
    start = 0
    for size, target in zip(sizes, targets):
        tokens = sum(lengths[start:start + size])
        # Short of the target only where the next sentence would cross it by more than half of it.
        if start + size < len(lengths):
            assert tokens >= target or tokens + lengths[start + size] / 2 > target
        # Past it only by the last sentence's lesser half (or a first sentence longer than it).
        assert size == 1 or tokens - lengths[start + size - 1] / 2 <= target
        start += size


def test_cut_article_extremes():
    assert cut_article([5, 5, 5], iter([0, 0, 0])) == [1, 1, 1]
    assert cut_article([5, 5, 5], iter([10**6])) == [3]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(REAL_VOCAB)


def test_corpus_text_is_the_articles_sentences_in_order_cut_to_the_lengths(corpus, tokenizer, tmp_path):
    articles = read_documents(corpus[0])
    text, counts = corpus_text(corpus[0], tokenizer, median_tokens=40.0, sigma=0.5, seed=[1, 0])
    path = tmp_path / "cut.txt"
    path.write_text(text, encoding="utf-8")
    documents = read_documents(str(path), "sentences")
    assert [s for d in documents for s in d.sentences] == [s for a in articles for s in a.sentences]
    assert counts["articles"] == len(articles) and counts["documents"] == len(documents) > 2 * len(articles)
    assert counts["sentences"] == sum(len(a.sentences) for a in articles)
    assert counts["tokens"] == sum(counts["document_tokens"])
    assert 25 <= np.median(counts["document_tokens"]) <= 70
    # The same seed gives the same bytes; another seed other cuts of the same sentences.
    assert corpus_text(corpus[0], tokenizer, 40.0, 0.5, [1, 0])[0] == text
    assert corpus_text(corpus[0], tokenizer, 40.0, 0.5, [2, 0])[0] != text


def test_write_once_leaves_the_same_text_and_refuses_other_text(tmp_path):
    path = str(tmp_path / "wikipedia_like-00000.txt")
    assert write_once(path, "a.\n\nb.\n") is True
    modified = os.stat(path).st_mtime_ns
    assert write_once(path, "a.\n\nb.\n") is False and os.stat(path).st_mtime_ns == modified
    with pytest.raises(OutputDirectoryError, match=r"wikipedia_like-00000\.txt: holds another corpus .*--output_dir"):
        write_once(path, "a.\n")
    assert open(path, encoding="utf-8").read() == "a.\n\nb.\n"
    assert os.listdir(tmp_path) == ["wikipedia_like-00000.txt"]


def test_total_variation_and_its_sampling_floor():
    reference = load_histogram(WIKIPEDIA_512)
    assert total_variation(reference, reference) == 0.0
    shifted = np.roll(reference, 1)
    assert total_variation(shifted, reference, bin_width=512) == 0.0
    assert 0.0 < total_variation(shifted, reference) < total_variation(np.roll(reference, 8), reference)
    assert 0.13 <= sampling_total_variation(reference, 3000) <= 0.15     # as the docstring says
    assert 0.07 <= sampling_total_variation(reference, 10_000) <= 0.085


def test_plan_packing_compares_with_a_reference_histogram(tmp_path):
    half = tmp_path / "half.json"
    half.write_text('{"max_sequence_length": 4, "histogram": [2, 0, 0, 2]}')
    flat = tmp_path / "flat.json"
    flat.write_text('{"max_sequence_length": 4, "histogram": [1, 1, 1, 1]}')
    result = run_command("plan_packing", f"--histogram={half}", "--algorithm=lp", f"--reference_histogram={flat}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-2] == (f"against {flat} (in brackets): padding 37.5% (37.5%), exactly L long 50.0% (25.0%), "
                         f"max speed-up 1.600x (1.600x)")
    assert lines[-1].startswith("total-variation distance 0.500 per length, 0.000 in 16-token bins;")
    other = tmp_path / "other.json"
    other.write_text('{"max_sequence_length": 8, "histogram": [1, 1, 1, 1, 1, 1, 1, 1]}')
    result = run_command("plan_packing", f"--histogram={half}", f"--reference_histogram={other}")
    assert result.returncode == 2
    assert f"--reference_histogram={other}: its L is 8, {half}'s 4: histograms of one L are compared" in result.stderr


@pytest.mark.slow
def test_the_script_writes_once_and_refuses_another_corpus_in_one_line(corpus, tmp_path):
    out = tmp_path / "out [1]"
    command = [sys.executable, os.path.join(REPO, "scripts", "make_wikipedia_like_corpus.py"),
               f"--input_file={corpus[0]},{corpus[1]}", f"--output_dir={out}", "--median_tokens=40"]
    first = subprocess.run(command, capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    assert f"{out}: 2 files (2 written, 0 already there)" in first.stdout
    written = {name: (out / name).read_bytes() for name in sorted(os.listdir(out)) if name != ".lock"}
    assert sorted(written) == ["wikipedia_like-00000.txt", "wikipedia_like-00001.txt"]
    again = subprocess.run(command, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and "(0 written, 2 already there)" in again.stdout
    other = subprocess.run(command + ["--seed=2"], capture_output=True, text=True, check=False)
    assert other.returncode != 0 and len(other.stderr.strip().splitlines()) == 1
    assert "wikipedia_like-00000.txt: holds another corpus" in other.stderr
    fewer = subprocess.run(command[:2] + [f"--input_file={corpus[0]}"] + command[3:], capture_output=True, text=True,
                           check=False)
    assert fewer.returncode != 0 and "holds another corpus (wikipedia_like-00001.txt, of more input files than 1)" \
        in fewer.stderr.strip().splitlines()[-1]
    nan = subprocess.run(command + ["--sigma=nan"], capture_output=True, text=True, check=False)
    assert nan.returncode == 2 and nan.stderr.strip().endswith("--sigma=nan: expected a finite number below 1e6")
    assert {name: (out / name).read_bytes() for name in sorted(os.listdir(out)) if name != ".lock"} == written
