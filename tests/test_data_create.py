import dataclasses
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import (
    MAX_PREDICTIONS,
    MAX_SEQ_LENGTH,
    REAL_VOCAB,
    REPO,
    SAMPLE,
    VOCAB,
    VOCAB_TOKENS,
    dataset_settings,
    run_command,
    tfrecords,
    write_corpus,
)

from bert_packed.errors import OutputDirectoryError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import DatasetFilesError, read_dataset_info
from bert_packed.inputs.input_files import expand_globs
from bert_packed.packing import load_histogram
from bert_packed.pretraining_data import create_dataset as create_module
from bert_packed.pretraining_data.corpus import CorpusError, read_documents
from bert_packed.pretraining_data.create_dataset import create_pretraining_dataset
from bert_packed.pretraining_data.tokenization import VocabularyError
from bert_packed.records import read_unpacked

CLS, SEP, MASK = (VOCAB_TOKENS.index(token) for token in ("[CLS]", "[SEP]", "[MASK]"))  # the test vocabulary's


UNPACKED = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS)


def read_all(directory, shapes=UNPACKED):
    batches = [batch for path in tfrecords(directory) for _, batch in read_unpacked(path, shapes)]
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def masking_statistics(records, mask):
    weights = records["masked_lm_weights"] > 0
    rows, columns = np.nonzero(weights)
    positions = records["masked_lm_positions"][rows, columns]
    shown = records["input_ids"][rows, positions]
    original = records["masked_lm_ids"][rows, columns]
    return {"mask": np.mean(shown == mask), "same": np.mean(shown == original),
            "random": np.mean((shown != mask) & (shown != original))}


def test_records_follow_the_mlperf_layout(unpacked_dir):
    records = read_all(unpacked_dir)
    lengths = records["input_mask"].sum(axis=1)
    assert len(lengths) == read_dataset_info(unpacked_dir).num_sequences == 122
    for row, length in enumerate(lengths):
        ids, segments = records["input_ids"][row], records["segment_ids"][row]
        boundary = int(np.argmax(segments[:length])) if segments[:length].any() else -1
        assert ids[0] == CLS and ids[length - 1] == SEP and ids[boundary - 1] == SEP and boundary > 1
        assert (segments[boundary:length] == 1).all() and (segments[:boundary] == 0).all()
        assert (ids[length:] == 0).all() and (segments[length:] == 0).all()
        num_predictions = int(records["masked_lm_weights"][row].sum())
        assert num_predictions == min(MAX_PREDICTIONS, max(1, round(length * 0.15)))
        positions = records["masked_lm_positions"][row, :num_predictions]
        assert (np.diff(positions) > 0).all() and positions.max() < length
        assert 0 not in positions and length - 1 not in positions and boundary - 1 not in positions
    assert records["next_sentence_labels"].mean() == pytest.approx(0.5, abs=0.2)


def test_histogram_matches_the_records(unpacked_dir):
    lengths = read_all(unpacked_dir)["input_mask"].sum(axis=1)
    histogram = load_histogram(os.path.join(unpacked_dir, "histogram.json"))
    assert len(histogram) == MAX_SEQ_LENGTH
    assert histogram.tolist() == np.bincount(lengths, minlength=MAX_SEQ_LENGTH + 1)[1:].tolist()


@pytest.mark.slow
def test_output_is_identical_whatever_the_number_of_workers(corpus, unpacked_dir, tmp_path):
    create_pretraining_dataset(corpus, str(tmp_path), dataset_settings(), num_workers=2)
    ours, theirs = tfrecords(str(tmp_path)), tfrecords(unpacked_dir)
    assert [os.path.basename(p) for p in ours] == [os.path.basename(p) for p in theirs]
    for a, b in zip(ours, theirs):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_another_seed_gives_other_masks(corpus, unpacked_dir, tmp_path):
    create_pretraining_dataset(corpus, str(tmp_path), dataset_settings(seed=1), num_workers=1)
    assert open(tfrecords(str(tmp_path))[0], "rb").read() != open(tfrecords(unpacked_dir)[0], "rb").read()


def test_an_interrupted_run_resumes_and_finishes_identically(corpus, unpacked_dir, tmp_path, monkeypatch, caplog):
    run_pass = create_module._run_pass
    last = len(corpus) - 1

    def interrupted_at_the_last_shard(file_index, *args):
        if file_index == last and args[0] == 1:
            raise KeyboardInterrupt
        return run_pass(file_index, *args)

    monkeypatch.setattr(create_module, "_run_pass", interrupted_at_the_last_shard)
    with pytest.raises(KeyboardInterrupt):
        create_pretraining_dataset(corpus, str(tmp_path), dataset_settings(), num_workers=1)
    monkeypatch.undo()
    assert not os.path.exists(tmp_path / "metadata.json")
    before = {p: os.path.getmtime(p) for p in tfrecords(str(tmp_path))}
    assert len(before) == len(tfrecords(unpacked_dir)) - 1
    with caplog.at_level(logging.INFO):
        create_pretraining_dataset(corpus, str(tmp_path), dataset_settings(), num_workers=1)
    assert f"resuming the unfinished run: {len(before)} units of its work already done" in caplog.text
    assert all(os.path.getmtime(p) == t for p, t in before.items())  # finished shards were not redone
    assert sorted(os.listdir(tmp_path)) == sorted(os.listdir(unpacked_dir))  # no work left
    for a, b in zip(tfrecords(str(tmp_path)), tfrecords(unpacked_dir)):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_a_directory_made_with_other_settings_is_refused(corpus, unpacked_dir):
    with pytest.raises(OutputDirectoryError, match="made with other settings"):
        create_pretraining_dataset(corpus, unpacked_dir, dataset_settings(dupe_factor=3), num_workers=1)


def test_a_rerun_knows_its_input_files_by_content_not_by_path(corpus, unpacked_dir, tmp_path, caplog):
    """The same text elsewhere (a moved checkout) finds its finished shards; a file edited in place
    under its name is made again, another vocabulary under the vocabulary's name is refused before
    any work."""
    import shutil

    moved = [str(shutil.copy(path, tmp_path / os.path.basename(path))) for path in corpus]
    shutil.copytree(unpacked_dir, tmp_path / "out")
    before = {path: os.path.getmtime(path) for path in tfrecords(str(tmp_path / "out"))}
    create_pretraining_dataset(moved, str(tmp_path / "out"), dataset_settings(), num_workers=1)
    assert {path: os.path.getmtime(path) for path in tfrecords(str(tmp_path / "out"))} == before
    text = open(moved[1], "rb").read()
    at = text.rindex(b"the")
    open(moved[1], "wb").write(text[:at] + b"thy" + text[at + 3:])  # a typo fixed: the same size
    with caplog.at_level(logging.WARNING):
        again = create_pretraining_dataset(moved, str(tmp_path / "out"), dataset_settings(), num_workers=1)
    assert "the input files changed since its unpacked data was made; making it again" in caplog.text
    assert again["source_sha256"][1] != read_dataset_info(unpacked_dir).details["source_sha256"][1]
    # The vocabulary by its content: the same under another name is the same; two tokens swapped
    # past its first 64 KiB is another. The real vocabulary, in a dataset of its own: the test
    # vocabulary is smaller than 64 KiB.
    lines = open(REAL_VOCAB, encoding="utf-8").read().splitlines()
    (tmp_path / "vocab").mkdir()
    renamed, swapped = tmp_path / "vocab" / "my_vocab.txt", tmp_path / "vocab" / "bert_uncased_vocab.txt"
    renamed.write_text("\n".join(lines) + "\n")
    swapped.write_text("\n".join(lines[:20000] + [lines[20001], lines[20000]] + lines[20002:]) + "\n")
    assert len("\n".join(lines[:20000]).encode()) > 64 << 10
    real = dataclasses.replace(dataset_settings(), vocab_file=REAL_VOCAB)
    out = str(tmp_path / "real")
    create_pretraining_dataset(corpus, out, real, num_workers=1)
    before = {path: os.path.getmtime(path) for path in tfrecords(out)}
    create_pretraining_dataset(corpus, out, dataclasses.replace(real, vocab_file=str(renamed)), num_workers=1)
    assert {path: os.path.getmtime(path) for path in tfrecords(out)} == before  # nothing made again
    with pytest.raises(OutputDirectoryError, match=r"made with other settings \(vocab_identity\)"):
        create_pretraining_dataset(corpus, out, dataclasses.replace(real, vocab_file=str(swapped)), num_workers=1)


def test_empty_documents_warn_by_default_and_can_be_errors(tmp_path):
    path = tmp_path / "wiki"
    path.write_text('<doc id="1" title="A">\nA\nSome text here. More text there.\n</doc>\n'
                    '<doc id="2" title="B">\nB\n</doc>\n')
    metadata = create_pretraining_dataset([str(path)], str(tmp_path / "out"), dataset_settings(), num_workers=1)
    assert metadata["num_empty_documents"] == 1 and metadata["num_documents"] == 1
    settings = dataset_settings()
    strict = type(settings)(**{**settings.__dict__, "empty_documents": "error"})
    with pytest.raises(CorpusError, match=f"{path}:5: empty document"):  # its <doc> line
        create_pretraining_dataset([str(path)], str(tmp_path / "strict"), strict, num_workers=1)
    assert not os.path.exists(tmp_path / "strict" / "metadata.json")


def test_missing_vocabulary_is_named(corpus, tmp_path):
    settings = dataset_settings()
    settings = type(settings)(**{**settings.__dict__, "vocab_file": str(tmp_path / "vocab.txt")})
    with pytest.raises(VocabularyError, match="vocab.txt: vocabulary file not found"):
        create_pretraining_dataset(corpus, str(tmp_path / "out"), settings, num_workers=1)


def test_masking_statistics_match_mlperf_on_the_sample(tmp_path):
    """The whole shipped sample at the MLPerf shapes (L=512, P=76), dupe_factor 1."""
    from bert_packed.pretraining_data.create_dataset import DatasetSettings
    from bert_packed.pretraining_data.instances import MaskingConfig

    samples = sorted(os.path.join(os.path.dirname(SAMPLE), n) for n in os.listdir(os.path.dirname(SAMPLE)))
    settings = DatasetSettings(REAL_VOCAB, True, MaskingConfig(), 1, 12345)
    metadata = create_pretraining_dataset(samples, str(tmp_path), settings, num_workers=1)
    records = read_all(str(tmp_path), Shapes(512, 76))
    stats = masking_statistics(records, mask=open(REAL_VOCAB, encoding="utf-8").read().splitlines().index("[MASK]"))
    assert stats["mask"] == pytest.approx(0.8, abs=0.01)
    assert stats["same"] == pytest.approx(0.1, abs=0.01)
    assert stats["random"] == pytest.approx(0.1, abs=0.01)
    lengths = records["input_mask"].sum(axis=1)
    predictions = records["masked_lm_weights"].sum(axis=1)
    assert predictions.tolist() == np.minimum(76, np.maximum(1, np.round(lengths * 0.15))).tolist()
    assert metadata["random_next_fraction"] == pytest.approx(0.5, abs=0.03)
    # The reference script on the same text (its own sentence segmentation): 2,397 instances,
    # 57% exactly 512 long, 53 predictions each. Same algorithm, so the same ballpark.
    assert 0.8 * 2397 <= metadata["num_instances"] <= 1.2 * 2397
    assert 0.45 <= metadata["full_length_fraction"] <= 0.75
    assert 45 <= metadata["predictions_per_instance"] <= 65
    assert 0.1 < 1 - lengths.mean() / 512 < 0.4 and (lengths <= 512).all()


def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "scripts", "create_pretraining_data.py"), *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_cli_glob_matching_nothing_is_one_line_and_exit_2(tmp_path):
    result = run_command("create_pretraining_data", f"--input_file={tmp_path}/nothing*", f"--output_dir={tmp_path}/out")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"create_pretraining_data: error: --input_file: '{tmp_path}/nothing*' matches no file")
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # the command for real, in a subprocess, once
def test_cli_writes_the_dataset(tmp_path):
    paths = write_corpus(str(tmp_path), num_files=1, docs_per_file=2)
    result = run_cli(f"--input_file={paths[0]}", f"--output_dir={tmp_path}/out", "--max_seq_length=64",
                     "--max_predictions_per_seq=10", "--dupe_factor=1", "--num_workers=1")
    assert result.returncode == 0, result.stderr
    summary, answer = result.stdout.strip().splitlines()  # what was made; whether packing is worth it
    assert answer.startswith("create_pretraining_data: packed (lp, up to 3 sequences a pack), these records are ")
    count = int(summary.split(": ", 1)[1].split(" training instances", 1)[0].replace(",", ""))
    assert count == json.load(open(tmp_path / "out" / "metadata.json"))["num_instances"] > 0
    assert sorted(os.listdir(tmp_path / "out")) == ["histogram.json", "metadata.json", "part-00000-000.tfrecord"]


def children(pid):
    """The pids whose parent is `pid` (from /proc)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGKILL", "SIGTERM"])
def test_workers_exit_when_the_command_is_killed(tmp_path, name):
    import signal
    import time

    paths = write_corpus(str(tmp_path), num_files=4, docs_per_file=9)  # 36 of the sample file's 37 documents
    process = subprocess.Popen([sys.executable, os.path.join(REPO, "scripts", "create_pretraining_data.py"),
                                f"--input_file={','.join(paths)}", f"--output_dir={tmp_path}/out",
                                "--max_seq_length=64", "--max_predictions_per_seq=10", "--num_workers=2"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(children(process.pid)) < 2 and time.monotonic() < deadline:  # the workers (and a tracker)
        time.sleep(0.2)
    workers = children(process.pid)
    assert len(workers) >= 2
    os.kill(process.pid, getattr(signal, name))
    _, stderr = process.communicate(timeout=120)
    if name == "SIGTERM":  # one line, the shell's status, and the same command goes on
        assert process.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]
        assert stderr.strip().splitlines()[-1] == (
            "create_pretraining_data: stopped (SIGTERM). Finished shards are kept; run the same command again to "
            "continue (exit status 143)")
    deadline = time.monotonic() + 20
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in workers if running(pid)]  # none works on for nobody


def test_a_script_that_makes_a_dataset_outside_its_main_guard_is_told_so(corpus, tmp_path, monkeypatch):
    """Each spawned worker imports the script that started it again (multiprocessing marks the
    process as _inheriting meanwhile): a script that called create_pretraining_data at its top
    level called it again in every worker, which found the directory locked by its parent, and the
    parent said a worker was killed, out of memory. By hand: such a script says this line in each
    worker, and the parent's last line names both causes."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(create_module.WorkerLostError, match=re.escape(
            "create_pretraining_data: called in a worker process as it started: each worker imports again the script "
            "that started it, so a script of your own calls create_pretraining_data under `if __name__ == "
            "\"__main__\":`")):
        create_pretraining_dataset(corpus, str(tmp_path / "out"), dataset_settings())
    assert not (tmp_path / "out").exists()


def test_a_script_read_from_stdin_makes_its_shards_in_its_own_process(corpus, tmp_path, monkeypatch, caplog):
    """`python - < script.py`: a spawned worker runs the script that started it again, and cannot
    read `<stdin>` (FileNotFoundError in each worker, and the parent blamed memory)."""
    import sys

    monkeypatch.setattr(sys.modules["__main__"], "__file__", "<stdin>", raising=False)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    metadata = create_pretraining_dataset(corpus, str(tmp_path / "out"), dataset_settings(), num_workers=2)
    assert metadata == create_pretraining_dataset(corpus, str(tmp_path / "one"), dataset_settings(), num_workers=1)
    assert "<stdin>: not a file, which worker processes could start from" in caplog.text


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def test_eval_split_holds_out_whole_documents(corpus, unpacked_dir, tmp_path):
    settings = dataset_settings()
    settings = type(settings)(**{**settings.__dict__, "eval_fraction": 0.3})
    metadata = create_pretraining_dataset(corpus, str(tmp_path), settings, num_workers=1)
    names = sorted(os.listdir(tmp_path))
    assert [n for n in names if n.startswith("eval-")] == ["eval-00000.tfrecord", "eval-00001.tfrecord"]
    assert metadata["num_eval_documents"] > 0 and metadata["num_eval_instances"] > 0
    assert metadata["num_documents"] + metadata["num_eval_documents"] == 16
    # Training and held-out records share no real (unmasked, non-special) token sequence of 8.
    def ngrams(paths):
        grams = set()
        for path in paths:
            for _, batch in read_unpacked(path, Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS)):
                for ids, mask in zip(batch["input_ids"], batch["input_mask"]):
                    ids = [t for t in ids[mask > 0] if t > MASK]  # the special tokens come first
                    grams.update(tuple(ids[i:i + 8]) for i in range(len(ids) - 8))
        return grams
    train = ngrams([p for p in tfrecords(str(tmp_path)) if "part-" in p])
    held_out = ngrams([p for p in tfrecords(str(tmp_path)) if "eval-" in p])
    assert held_out and len(train & held_out) < 0.01 * len(held_out)
    histogram = load_histogram(os.path.join(tmp_path, "histogram.json"))
    assert histogram.sum() == metadata["num_instances"]  # training records only


def test_a_held_out_share_that_holds_out_nothing_writes_no_empty_eval_file(corpus, tmp_path, caplog):
    # 16 documents at 1%: the seeded draws hold none out. An empty eval-*.tfrecord listed in
    # metadata.json made every command refuse the dataset's own eval glob as "empty".
    settings = dataclasses.replace(dataset_settings(), eval_fraction=0.01)
    metadata = create_pretraining_dataset(corpus, str(tmp_path), settings, num_workers=1)
    assert metadata["num_eval_instances"] == 0 and metadata["eval_files"] == []
    assert not [n for n in os.listdir(tmp_path) if n.startswith("eval-")]
    assert "--eval_fraction=0.01 held out no document of 2 input files" in caplog.text
    assert len(expand_globs(str(tmp_path / "*.tfrecord"), "--input_files")) == len(metadata["files"]) == 4
    # The jobs are done (their summaries alone): the same call again redoes nothing.
    with caplog.at_level(logging.INFO):
        assert create_pretraining_dataset(corpus, str(tmp_path), settings, num_workers=1) == metadata
    assert "already made with these settings and inputs; nothing to do" in caplog.text
    # A shard deleted from the finished dataset: refused, not taken for finished.
    os.remove(tmp_path / "part-00001-000.tfrecord")
    with pytest.raises(DatasetFilesError, match=r"part-00001-000.tfrecord: gone \(1 of the 5 files its metadata.json"):
        create_pretraining_dataset(corpus, str(tmp_path), settings, num_workers=1)
    os.remove(tmp_path / "histogram.json")  # which it records the SHA-256 of
    with pytest.raises(DatasetFilesError, match=r"part-00001-000.tfrecord: gone \(2 of the 5 files"):
        create_pretraining_dataset(corpus, str(tmp_path), settings, num_workers=1)


def test_a_huge_line_without_a_boundary_is_cut_into_pieces_and_fills_instances(tmp_path, caplog, monkeypatch):
    words = [word for word in open(SAMPLE, encoding="utf-8").read().split() if word.isalpha()]
    line = " ".join(words[i % len(words)] for i in range(200_000))  # ~1.3 MB, one "sentence"
    (tmp_path / "huge.txt").write_text(line)  # no newline at all
    monkeypatch.chdir(tmp_path)
    metadata = create_pretraining_dataset(["huge.txt"], "out", dataset_settings(dupe_factor=1, short_seq_prob=0.0),
                                          num_workers=1)
    assert " huge.txt:1: a sentence of" in caplog.text and "is cut into" in caplog.text
    assert str(tmp_path) not in caplog.text  # the file named as given, not made absolute
    # Each piece is a sentence: hundreds of instances, not one; the tokens an instance cannot hold
    # are truncated as the reference truncates, and said.
    assert metadata["num_instances"] > 200
    assert "tokens is longer than an instance (125): all but 125 of them go unused" in caplog.text


def _write_in_format(corpus, directory, input_format):
    """The test corpus's documents, file by file, written in another input format."""
    paths = []
    for path in corpus:
        documents = [d.sentences for d in read_documents(path) if d.sentences]
        if input_format == "sentences":
            text = "\n\n".join("\n".join(sentences) for sentences in documents) + "\n"
        elif input_format == "documents":
            text = "".join(" ".join(sentences) + "\n" for sentences in documents)
        else:
            text = "".join(json.dumps({"id": k, "text": " ".join(sentences)}) + "\n" for k, sentences in enumerate(documents))
        paths.append(os.path.join(directory, f"{os.path.basename(path)}.{input_format}"))
        with open(paths[-1], "w", encoding="utf-8") as f:
            f.write(text)
    return paths


def test_every_input_format_gives_the_same_instances_of_the_same_documents(corpus, tmp_path, caplog):
    settings = dataset_settings(dupe_factor=1)
    expected = create_pretraining_dataset(corpus, str(tmp_path / "wikiextractor"), settings, num_workers=1)
    assert (expected["num_documents"], expected["num_sentences"]) == (16, 130)
    assert 0.4 < expected["random_next_fraction"] < 0.6
    for input_format in ("sentences", "documents", "jsonl"):
        inputs = _write_in_format(corpus, tmp_path, input_format)
        with caplog.at_level(logging.INFO):
            caplog.clear()
            metadata = create_pretraining_dataset(inputs, str(tmp_path / input_format), settings, num_workers=1)
        assert f"(--input_format={input_format}), detected in {inputs[0]} and its other file:" in caplog.text
        assert "warning" not in caplog.text.lower()
        assert metadata["settings"]["input_format"] == input_format
        for key in ("num_documents", "num_sentences", "num_sequences", "num_tokens", "random_next_fraction"):
            assert metadata[key] == expected[key], (input_format, key)
        for name, values in read_all(str(tmp_path / "wikiextractor")).items():
            np.testing.assert_array_equal(read_all(str(tmp_path / input_format))[name], values)


def test_files_that_detect_as_other_formats_are_refused_naming_both(corpus, tmp_path):
    """One sentence a line beside one document a line: read in one format, the second file's
    articles would be cut into documents of a sentence each, IsNext pairs across articles."""
    sentences = _write_in_format(corpus[:1], tmp_path, "sentences")[0]
    documents = _write_in_format(corpus[1:], tmp_path, "documents")[0]
    with pytest.raises(CorpusError) as refused:
        create_pretraining_dataset([sentences, documents], str(tmp_path / "out"), dataset_settings(), num_workers=1)
    assert str(refused.value) == (
        f"{sentences} reads as one sentence a line, a blank line between documents (blank lines separate groups of "
        f"lines) but {documents} as one document a line (no blank lines, and 8 of its first 8 lines hold several "
        f"sentences): the files of one corpus are read in one format; give --input_format, or make records of each "
        f"format in their own run")
    assert not (tmp_path / "out").exists()
    given = create_pretraining_dataset([sentences, documents], str(tmp_path / "given"),
                                       dataclasses.replace(dataset_settings(), input_format="documents"), num_workers=1)
    assert given["settings"]["input_format"] == "documents"


def test_compressed_corpora_give_the_same_records_and_a_damaged_one_is_one_line(corpus, tmp_path):
    import bz2
    import gzip
    import lzma
    import zlib

    settings = dataset_settings(dupe_factor=1)
    create_pretraining_dataset(corpus, str(tmp_path / "plain"), settings, num_workers=1)
    expected = read_all(str(tmp_path / "plain"))
    for suffix, compress in ((".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)):
        inputs = []
        for path in corpus:
            inputs.append(str(tmp_path / (os.path.basename(path) + suffix)))
            with open(path, "rb") as source, open(inputs[-1], "wb") as f:
                f.write(compress(source.read()))
        output = str(tmp_path / suffix[1:])
        create_pretraining_dataset(inputs, output, settings, num_workers=1)
        for name, values in expected.items():
            np.testing.assert_array_equal(read_all(output)[name], values)
    cut = tmp_path / "cut.gz"
    cut.write_bytes((tmp_path / (os.path.basename(corpus[0]) + ".gz")).read_bytes()[:600])
    whole = (tmp_path / (os.path.basename(corpus[0]) + ".gz")).read_bytes()
    for at in range(len(whole) // 2, len(whole)):  # a byte of the deflate stream changed: zlib's own error
        damaged = whole[:at] + bytes([whole[at] ^ 0x55]) + whole[at + 1:]
        try:
            gzip.decompress(damaged)
        except zlib.error:
            break
        except (OSError, EOFError):  # a CRC or length the change left wrong: not zlib's error
            continue
    else:
        raise AssertionError("no change of one byte gave zlib's own error")
    (tmp_path / "damaged.gz").write_bytes(damaged)
    with pytest.raises(CorpusError, match=r"damaged.gz: gzip-compressed, and it cannot be decompressed after line "):
        create_pretraining_dataset([str(tmp_path / "damaged.gz")], str(tmp_path / "refused"), settings, num_workers=1)
    zstd = tmp_path / "text.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(20))
    for path, message in ((cut, rf"^{cut}: gzip-compressed, and it cannot be decompressed after line \d+ \(Compressed "
                                rf"file ended before the end-of-stream marker was reached\): cut short or damaged\?$"),
                          (zstd, rf"^{zstd}: zstd-compressed; decompress it first \(gzip, bzip2 and xz files are read "
                                 rf"as they are\)$")):
        with pytest.raises(CorpusError, match=message):
            create_pretraining_dataset([str(path)], str(tmp_path / "refused"), settings, num_workers=1)
    random = tmp_path / "random.gz"  # random bytes under a gzip name were "not UTF-8 text"
    random.write_bytes(bytes(range(7, 250)))
    with pytest.raises(CorpusError, match=rf"^{random}: named as gzip-compressed, but its first bytes are not gzip's;"):
        create_pretraining_dataset([str(random)], str(tmp_path / "refused"), settings, num_workers=1)
    assert not (tmp_path / "refused").exists()


def test_a_corpus_read_in_the_wrong_format_is_named_by_its_statistics(corpus, tmp_path, caplog):
    """One document a line, read as one sentence a line: one document a file; documents of one
    sentence each: nearly every next segment random. Each warned in one line naming the format."""
    documents = _write_in_format(corpus, tmp_path, "documents")
    settings = dataset_settings(dupe_factor=1)
    misread = create_pretraining_dataset(documents, str(tmp_path / "misread"),
                                         dataclasses.replace(settings, input_format="sentences"), num_workers=1)
    assert misread["num_documents"] == 2
    read_as = "read as one sentence a line, a blank line between documents (--input_format=sentences)"
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"2 documents of 65 sentences from 2 input files, {read_as}, where a blank line ends a document: if each line "
        f"is a document, give --input_format=documents",
        # A file of one document has no other document to draw a random next segment from.
        f"19% of the next-sentence pairs take a random next segment, not about 50%: documents hold 65.0 sentences on "
        f"average, {read_as}"]
    single = tmp_path / "one_sentence_documents.txt"
    single.write_text("".join(s + "\n" for path in corpus for d in read_documents(path) for s in d.sentences[:1]))
    caplog.clear()
    metadata = create_pretraining_dataset([str(single)], str(tmp_path / "single"),
                                          dataclasses.replace(settings, input_format="documents"), num_workers=1)
    assert metadata["num_documents"] == 16 and metadata["random_next_fraction"] == 1.0
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "100% of the next-sentence pairs take a random next segment, not about 50%: documents hold 1.0 sentences on "
        "average, read as one document a line (--input_format=documents): if a document's sentences are on lines of "
        "their own, give one sentence a line with blank lines between documents (--input_format=sentences)"]


def test_cli_takes_the_input_format_and_says_the_detected_one(corpus, tmp_path):
    inputs = _write_in_format(corpus, tmp_path, "jsonl")
    common = ("--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=1", "--num_workers=1",
              f"--vocab_file={VOCAB}")
    result = run_command("create_pretraining_data", f"--input_file={inputs[0]}", f"--output_dir={tmp_path}/auto",
                         *common)
    assert result.returncode == 0, result.stderr
    assert f"input format: JSON lines, one document an object (--input_format=jsonl), detected in {inputs[0]}: its " \
           f"first line opens a JSON object" in result.stderr.splitlines()
    # Its last line: is packing worth it for these records (the planner's answer at their L).
    from bert_packed.packing import plan

    factor = plan(load_histogram(str(tmp_path / "auto" / "histogram.json")), 128, "lp", 3).packing_factor
    assert 1.0 < factor < 3.0
    assert result.stdout.splitlines()[-1] == (
        f"create_pretraining_data: packed (lp, up to 3 sequences a pack), these records are {factor:.2f} sequences a "
        f"pack: training packed is at most {factor:.2f}x as fast in sequences a second"
        f"{'; little to gain' if factor < 1.25 else ''} (docs/packing.md: what "
        f"corpora gain)")
    result = run_command("create_pretraining_data", f"--input_file={inputs[0]}", f"--output_dir={tmp_path}/field",
                         "--input_format=jsonl", "--text_field=body", *common)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].endswith(f'{inputs[0]}:1: expected a JSON object with a string field "body" '
                                                   f"(--text_field), found fields id, text")
