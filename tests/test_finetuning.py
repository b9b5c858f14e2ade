"""Fine-tuning's tasks, examples and head: GLUE's files read as google-research reads them, each
example packed exactly once, and packed rows giving each example the logits, loss and gradients
it gets alone in a row."""

import json
import math
import os
import re

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from conftest import TINY, VOCAB

from bert_packed.errors import InternalError
from bert_packed.finetuning.encode import encode_examples, make_rows, truncated_lengths
from bert_packed.finetuning.metrics import scores
from bert_packed.finetuning.tasks import TASKS, TaskDataError, get_task, read_examples, task_labels
from bert_packed.model import (
    BertClassifierModel,
    BertConfig,
    BertPretrainingModel,
    CheckpointError,
    export_google_checkpoint,
    export_huggingface,
    load_weights,
)
from bert_packed.packing.assign import assign_to_packs
from bert_packed.pretraining_data.tokenization import Tokenizer
from bert_packed.training.checkpoints import load_run_weights
from bert_packed.training.losses import classifier_sums

SENTENCES = ["the cat sat on the mat .", "it was a sunny day", "paris is the capital of france .",
             "he said that it would rain , but it did not rain at all that day .", "no", "a dog barked twice",
             "the history of the city begins in the year one thousand", "she left"]

# One line of each GLUE task's file (after its header), as the GLUE benchmark's files hold them.
GLUE_LINES = {
    "cola": ("gj04\t1\t\tthe cat sat on the mat .", "1", None),
    "sst-2": ("it was a sunny day\t1", "1", None),
    "mrpc": ("1\t702876\t702977\tthe cat sat .\the said \"no\" .", "1", 'he said "no" .'),
    "qqp": ("7\t15\t16\twhy is the sky blue ?\twhat makes the sky blue ?\t1", "1", "what makes the sky blue ?"),
    "sts-b": ("0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\ta plane takes off .\tan air plane is taking "
              "off .\t5.000", 5.0, "an air plane is taking off ."),
    "mnli": ("0\t31193\t31193n\tgovernment\t( x )\t( y )\t(ROOT x)\t(ROOT y)\tthe cat sat .\tthe cat stood .\t"
             "neutral\tneutral", "neutral", "the cat stood ."),
    "qnli": ("0\twhen did it rain ?\tit rained on monday .\tentailment", "entailment", "it rained on monday ."),
    "rte": ("0\tthe cat sat .\ta cat exists .\tnot_entailment", "not_entailment", "a cat exists ."),
}


def write_task_file(tmp_path, task_name, lines, name="train.tsv"):
    task = TASKS[task_name]
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in (["header"] if task.header else []) + lines))
    return str(path)


@pytest.mark.parametrize("task_name", sorted(GLUE_LINES))
def test_each_glue_task_reads_its_text_pair_and_label_from_its_columns(tmp_path, task_name):
    line, label, pair = GLUE_LINES[task_name]
    examples = read_examples(TASKS[task_name], write_task_file(tmp_path, task_name, [line, line]))
    assert len(examples) == 2
    assert examples[0].label == label and examples[0].text_pair == pair
    assert examples[1].line == (3 if TASKS[task_name].header else 2)
    assert examples[0].text in line.split("\t")


def test_mnli_s_dev_file_takes_the_gold_label_after_five_annotators(tmp_path):
    dev = "0\t1\t1n\tfiction\tx\ty\tx\ty\ta man sleeps .\ta man is awake .\tneutral\tcontradiction\tcontradiction" \
          "\tcontradiction\tneutral\tcontradiction"
    [example] = read_examples(TASKS["mnli"], write_task_file(tmp_path, "mnli", [dev], "dev_matched.tsv"))
    assert (example.text, example.text_pair, example.label) == ("a man sleeps .", "a man is awake .", "contradiction")


@pytest.mark.parametrize("task_name, line, message", [
    ("mrpc", "1\t702876\tthe cat sat .\the said no .", "train.tsv:2: 4 tab-separated columns; mrpc expects 5"),
    ("sst-2", "it was sunny\tpositive", "train.tsv:2: label 'positive' is not one of sst-2's labels (0, 1)"),
    ("sts-b", GLUE_LINES["sts-b"][0].replace("5.000", "high"), "train.tsv:2: label 'high' is not a finite number"),
    ("sts-b", GLUE_LINES["sts-b"][0].replace("5.000", "nan"), "train.tsv:2: label 'nan' is not a finite number"),
    ("mnli", "0\t1\t1n\tfiction\tx\ty\tneutral", "train.tsv:2: 7 tab-separated columns; mnli expects 12 or 16"),
])
def test_a_bad_line_is_named_with_its_file_and_line(tmp_path, task_name, line, message):
    path = write_task_file(tmp_path, task_name, [GLUE_LINES[task_name][0], line])
    with pytest.raises(TaskDataError) as error:
        read_examples(TASKS[task_name], path)
    assert str(error.value).startswith(str(tmp_path / message.replace(":2:", f":{2 + TASKS[task_name].header}:")))


def test_lines_end_at_newlines_only_blank_lines_and_a_byte_order_mark_are_passed_over(tmp_path):
    path = tmp_path / "train.tsv"
    mrpc = GLUE_LINES["mrpc"][0].replace("the cat sat .", "the cat\u2028sat\x85 .")  # separators inside a text
    path.write_bytes(("\ufeffheader\r\n" + mrpc + "\r\n\r\n" + GLUE_LINES["mrpc"][0] + "\n\n").encode())
    examples = read_examples(TASKS["mrpc"], str(path))
    assert [(e.text, e.line) for e in examples] == [("the cat\u2028sat\x85 .", 2), ("the cat sat .", 4)]
    path.write_bytes(b"header\n" + GLUE_LINES["mrpc"][0].encode() + b"\n1\t2\t3\tcaf\xe9\tx\n")
    with pytest.raises(TaskDataError, match=r"train.tsv:3: not UTF-8 \(byte 0xe9\); expected UTF-8 text"):
        read_examples(TASKS["mrpc"], str(path))
    empty_question = "7\t15\t16\twhy is the sky blue ?\t\t1"  # Quora's data has a few: read, as google-research does
    assert read_examples(TASKS["qqp"], write_task_file(tmp_path, "qqp", [empty_question]))[0].text_pair == ""


def test_an_empty_file_or_a_header_alone_is_refused(tmp_path):
    for text in ("", "sentence\tlabel\n"):
        (tmp_path / "train.tsv").write_text(text)
        with pytest.raises(TaskDataError, match=r"train.tsv: no examples \(an empty file or only its header\)"):
            read_examples(TASKS["sst-2"], str(tmp_path / "train.tsv"))
    with pytest.raises(TaskDataError, match=r"--task_name=squad: expected one of cola, sst-2, mrpc"):
        get_task("squad")
    assert get_task("SST-2") is TASKS["sst-2"]


def test_a_task_of_your_own_in_json_lines_takes_its_training_file_s_labels(tmp_path):
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    train.write_text('{"text": "good film", "label": "pos"}\n\n{"text": "bad", "text_pair": "very", "label": "neg"}\n'
                     '{"text": "fine", "label": 3}\n')
    examples = read_examples(TASKS["jsonl"], str(train))
    assert [(e.text, e.text_pair, e.label, e.line) for e in examples] == [
        ("good film", None, "pos", 1), ("bad", "very", "neg", 3), ("fine", None, "3", 4)]
    labels = task_labels(TASKS["jsonl"], examples)
    assert labels == ("3", "neg", "pos")
    numbered = [read_one(TASKS["jsonl"], "x", None, label) for label in ("10", "2", "1", "2")]
    assert task_labels(TASKS["jsonl"], numbered) == ("1", "2", "10")
    odd = [read_one(TASKS["jsonl"], "x", None, label) for label in ("1", "01", "--1", "\u00b2", "-3")]
    assert task_labels(TASKS["jsonl"], odd) == ("-3", "01", "1", "--1", "\u00b2")  # the same order in every process
    with pytest.raises(TaskDataError, match="train.jsonl: every example has the label '2'; a classifier needs at least"):
        task_labels(TASKS["jsonl"], numbered[1::2], "train.jsonl")
    for line, message in [('{"text": "x", "label": "meh"}', 'dev.jsonl:1: label "meh" is not among the training '
                                                             "file's labels (3, neg, pos)"),
                          ('{"text": "x"', "dev.jsonl:1: not JSON"),
                          ('["x", "pos"]', 'dev.jsonl:1: expected an object with a "text" string and a "label"'),
                          ('{"text": "x", "label": 1.5}', 'dev.jsonl:1: "label" is 1.5; expected a class name'),
                          ('{"text": "x", "text_pair": 2, "label": "pos"}', 'dev.jsonl:1: "text_pair" is int')]:
        dev.write_text(line + "\n")
        with pytest.raises(TaskDataError) as error:
            read_examples(TASKS["jsonl"], str(dev), labels)
        assert str(error.value).startswith(str(tmp_path / message)), str(error.value)


def _truncated_by_popping(length, pair_length, max_tokens):
    """google-research's _truncate_seq_pair, literally."""
    while length + pair_length > max_tokens:
        if length > pair_length:
            length -= 1
        else:
            pair_length -= 1
    return length, pair_length


def test_truncation_is_google_research_s():
    rng = np.random.default_rng(0)
    for length, pair_length, max_tokens in rng.integers(0, 60, size=(3000, 3)):
        assert truncated_lengths(int(length), int(pair_length), int(max_tokens)) == _truncated_by_popping(
            int(length), int(pair_length), int(max_tokens))


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(VOCAB)


def test_examples_become_cls_text_sep_pair_sep_cut_to_the_length(tokenizer):
    task = TASKS["mrpc"]
    examples = [read_one(task, "the cat sat on the mat .", "it was a sunny day", "1"),
                read_one(task, " ".join(["word"] * 20), "no", "0")]
    encoded = encode_examples(examples, task, task.labels, tokenizer, max_seq_length=12)
    cat = tokenizer.encode(["the cat sat on the mat ."])[0].tolist()
    sunny = tokenizer.encode(["it was a sunny day"])[0].tolist()
    # 7 + 5 text tokens into 9: the longer loses 2, then one each.
    assert encoded.input_ids[0].tolist() == [tokenizer.cls_id, *cat[:5], tokenizer.sep_id, *sunny[:4], tokenizer.sep_id]
    assert encoded.segment_ids[0].tolist() == [0] * 7 + [1] * 5
    assert len(encoded.input_ids[1]) == 12 and encoded.input_ids[1][-3:].tolist()[-1] == tokenizer.sep_id
    assert encoded.targets["labels"].tolist() == [1.0, 0.0]


def read_one(task, text, pair, label):
    from bert_packed.finetuning.tasks import Example

    return Example(text, pair, label, 1)


def test_packing_keeps_every_example_exactly_once_in_its_own_slot(tokenizer):
    task = TASKS["sst-2"]
    examples = [read_one(task, sentence, None, str(i % 2)) for i, sentence in enumerate(SENTENCES * 5)]
    encoded = encode_examples(examples, task, task.labels, tokenizer, max_seq_length=32)
    assignment = assign_to_packs(encoded.lengths, 32, 4, "lp", seed=3)
    rows = make_rows(encoded, assignment, 32, 4)
    assert assignment.num_packs < len(examples) / 2  # short texts: several a row
    weights = rows["label_weights"].astype(bool)
    assert sorted(rows["example_ids"][weights].tolist()) == list(range(len(examples)))
    for row in range(assignment.num_packs):
        for slot in np.flatnonzero(weights[row]):
            example = rows["example_ids"][row, slot]
            tokens = rows["sequence_ids"][row] == slot + 1
            assert rows["input_ids"][row][tokens].tolist() == encoded.input_ids[example].tolist()
            assert rows["positions"][row][tokens].tolist() == list(range(len(encoded.input_ids[example])))
            assert rows["input_ids"][row, rows["cls_positions"][row, slot]] == tokenizer.cls_id
            assert rows["labels"][row, slot] == encoded.targets["labels"][example]
    alone = assign_to_packs(encoded.lengths, 32, 1)
    assert alone.num_packs == len(examples) and set(alone.position.tolist()) == {0}


def classifier_rows(tokenizer, regression=False):
    """Packed rows and one-example rows of the same examples."""
    task = TASKS["sts-b" if regression else "mrpc"]
    examples = [read_one(task, a, b, str(i % 5) if regression else str(i % 2))
                for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[3:] + SENTENCES[:3]))]
    encoded = encode_examples(examples, task, task.labels, tokenizer, max_seq_length=48)
    packed = make_rows(encoded, assign_to_packs(encoded.lengths, 48, 3, seed=1), 48, 3)
    alone = make_rows(encoded, assign_to_packs(encoded.lengths, 48, 1), 48, 1)
    return packed, alone


def by_example(rows, values):
    """Per-example values [n, ...] from per-slot ones [B, S, ...]."""
    weights = rows["label_weights"].astype(bool)
    order = np.argsort(rows["example_ids"][weights])
    return np.asarray(values)[weights][order]


@pytest.mark.parametrize("regression", [False, True])
def test_packed_rows_give_each_example_its_own_logits_loss_and_gradients(tokenizer, regression):
    config = BertConfig(**TINY, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertClassifierModel(config, num_outputs=1 if regression else 2)
    model.build()
    packed, alone = classifier_rows(tokenizer, regression)
    assert packed["input_ids"].shape[0] < alone["input_ids"].shape[0]
    results = []
    for rows in (packed, alone):
        features = {k: tf.constant(v) for k, v in rows.items()}
        with tf.GradientTape() as tape:
            logits = model(features, training=True, dropout_seed=tf.constant([1, 2]))["logits"]
            sums = classifier_sums({"logits": logits}, features, regression)
            loss = sums["example_loss"] / sums["examples"]
        gradients = tape.gradient(loss, model.trainable_variables)
        results.append((by_example(rows, logits.numpy()), float(loss), float(sums["examples"]), gradients))
    (packed_logits, packed_loss, packed_count, packed_gradients), (logits, loss, count, gradients) = results
    assert packed_count == count == len(SENTENCES)
    np.testing.assert_allclose(packed_logits, logits, atol=1e-6)
    assert packed_loss == pytest.approx(loss, rel=1e-6)
    held = [v.path for v in model.weights]  # no pre-training head: nothing in the model is left untrained
    assert [v.path for v in model.trainable_variables] == held
    assert not any("masked_lm" in path or "seq_relationship" in path for path in held)
    assert any("pooler" in path for path in held) and any("classifier" in path for path in held)
    for a, b in zip(packed_gradients, gradients):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(), atol=1e-6)


def test_the_classifier_starts_from_a_pretraining_model_s_weights(tmp_path):
    config = BertConfig(**TINY)
    pretrained = BertPretrainingModel(config)
    pretrained.build()
    path = export_google_checkpoint(pretrained, str(tmp_path / "bert_model.ckpt"))
    classifier = BertClassifierModel(config, num_outputs=3)
    classifier.build()
    assert load_weights(classifier.encoder, path) == 23  # a google-research checkpoint's, query/key/value apart
    for a, b in zip(pretrained.encoder.weights, classifier.encoder.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_classifier_starts_from_weights_without_a_pooler_and_from_a_run_s_checkpoints_folder(tmp_path, caplog):
    """A masked-LM-only run's weights (or a span model's) have no pooler: the classifier takes the
    rest, its pooler starting from random weights as transformers' does, and says so (it was
    refused with advice to give --nsp_loss=false, which run_classifier has no flag for). A run's
    directory or checkpoints/ folder is its newest weights that read whole, a run killed before it
    exported any too (the folder was read as a TF1 checkpoint, and refused). Weights that have a
    pooler never load without it: a damaged pooler is refused (helper-8's findings)."""
    import shutil

    from bert_packed.training.objective import Classification

    config = BertConfig(**TINY)
    masked_lm_only = BertPretrainingModel(config, next_sentence_prediction=False)
    masked_lm_only.build()
    odd = tmp_path / "odd [1]"  # TensorFlow reads a checkpoint's path as a pattern
    path = export_google_checkpoint(masked_lm_only, str(odd / "masked_lm_only.ckpt"))
    classifier = BertClassifierModel(config, num_outputs=3)
    classifier.build()
    pooler = classifier.encoder.pooler.kernel.numpy()
    Classification(None, ("a", "b", "c")).load_initial_weights(classifier, path)
    for a, b in zip(masked_lm_only.encoder.weights, classifier.encoder.weights[:-2], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(classifier.encoder.pooler.kernel.numpy(), pooler)
    assert f"{path}: no pooler (weights trained with --nsp_loss=false, or a span model's)" in caplog.text
    # The old code's masked-LM-only run (tests/test_model.py), killed before it exported: its
    # directory and its checkpoints/ folder.
    old = BertConfig(vocab_size=16, hidden_size=4, num_hidden_layers=2, num_attention_heads=1, intermediate_size=8,
                     max_position_embeddings=8)
    run = shutil.copytree(os.path.join(os.path.dirname(__file__), "data", "checkpoints_of_2c189b7",
                                       "pretraining_without_nsp"), tmp_path / "run")
    (run / "run.json").write_text(json.dumps({"nsp_loss": False}))
    reference = BertPretrainingModel(old, next_sentence_prediction=False)
    reference.build()
    load_run_weights(reference, str(run), 1)
    for given in (run, run / "checkpoints"):
        classifier = BertClassifierModel(old, num_outputs=2)
        classifier.build()
        read = Classification(None, ("a", "b")).load_initial_weights(classifier, str(given))
        assert read == str(run / "checkpoints" / "ckpt-1")  # what the run's log says it started from
        for a, b in zip(reference.encoder.weights, classifier.encoder.weights[:-2], strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    # A pooler cut short (the file's last tensors) is refused, not taken for no pooler.
    encoder = BertPretrainingModel(config).encoder
    encoder.build()
    path = export_google_checkpoint(encoder, str(tmp_path / "encoder.ckpt"))
    data = tmp_path / "encoder.ckpt.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-2 * 4 * config.hidden_size])  # the bias, and the kernel's last row
    with pytest.raises(CheckpointError, match=r"cannot read bert/pooler/dense/\w+ .*cut short or damaged"):
        Classification(None, ("a", "b")).load_initial_weights(BertClassifierModel(config, num_outputs=2), path)
    # Weights that do not fit, the pooler aside, are refused as before, naming what does not fit.
    wider = BertPretrainingModel(BertConfig(**{**TINY, "intermediate_size": 2 * TINY["intermediate_size"]}),
                                 next_sentence_prediction=False)
    wider.build()
    path = export_google_checkpoint(wider, str(tmp_path / "wider.ckpt"))
    with pytest.raises(CheckpointError, match=r"does not fit the model \(\d+ problems\): bert/encoder/layer_0/"
                                              r"intermediate/dense/kernel has shape"):
        Classification(None, ("a", "b")).load_initial_weights(BertClassifierModel(config, num_outputs=2), path)


def test_scores_are_glue_s():
    labels = np.array([1, 0, 1, 1, 0, 0, 1, 0])
    predictions = np.array([1, 0, 0, 1, 1, 0, 1, 1])
    tp, fp, fn, tn = 3, 2, 1, 2
    got = scores(("accuracy", "f1", "matthews_corrcoef"), predictions, labels)
    assert got["accuracy"] == 5 / 8
    assert got["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert got["matthews_corrcoef"] == pytest.approx((tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp)
                                                                                   * (tn + fn)))
    values, truth = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0.0, 1.0, 2.0, 3.0])
    got = scores(("pearson", "spearman"), values, truth)
    assert got["pearson"] == pytest.approx(np.corrcoef(values, truth)[0, 1])
    assert got["spearman"] == pytest.approx(0.8)
    assert scores(("pearson", "matthews_corrcoef"), np.zeros(4), truth) == {"pearson": 0.0, "matthews_corrcoef": 0.0}
    assert scipy.stats.spearmanr(values, truth)[0] == pytest.approx(0.8)
    assert json.dumps(scores(("f1",), np.zeros(3), np.zeros(3))) == '{"f1": 0.0}'
    with pytest.raises(InternalError, match=r"predictions \(3, 1\) against labels \(3,\)"):
        scores(("accuracy",), np.zeros((3, 1)), np.zeros(3))  # broadcast, it would score 9 pairs


@pytest.fixture(scope="module")
def exported_classifier(tokenizer, tmp_path_factory):
    """(a classifier of MRPC's two labels, its packed rows, its Hugging Face export)."""
    model = BertClassifierModel(BertConfig(**TINY), num_outputs=2)
    model.build()
    packed, _ = classifier_rows(tokenizer)
    directory = str(tmp_path_factory.mktemp("classifier") / "hf")
    export_huggingface(model, directory, VOCAB, do_lower_case=True, labels=("0", "1"))
    return model, packed, directory


def test_a_classifier_exports_as_a_sequence_classifier_without_pretraining_heads(exported_classifier):
    from safetensors.numpy import load_file

    model, _, directory = exported_classifier
    config = json.load(open(os.path.join(directory, "config.json")))
    assert config["architectures"] == ["BertForSequenceClassification"] and config["num_labels"] == 2
    assert config["id2label"] == {"0": "0", "1": "1"} and config["problem_type"] == "single_label_classification"
    tensors = load_file(os.path.join(directory, "model.safetensors"))
    np.testing.assert_array_equal(tensors["classifier.weight"], model.classifier.kernel.numpy().T)
    assert "bert.pooler.dense.weight" in tensors and not any(name.startswith("cls.") for name in tensors)
    with pytest.raises(InternalError, match="a classifier of 2 outputs exported with 3 labels"):
        export_huggingface(model, directory, VOCAB, do_lower_case=True, labels=("a", "b", "c"))
    # The export starts a classifier whole (--init_checkpoint of a fine-tuned model, to evaluate it).
    from bert_packed.training.objective import Classification

    again = BertClassifierModel(BertConfig(**TINY), num_outputs=2)
    again.build()
    Classification(None, ("0", "1")).load_initial_weights(again, directory)
    for a, b in zip(model.weights, again.weights, strict=True):
        if "masked_lm" not in a.path and "seq_relationship" not in a.path:  # not exported: not trained
            np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow  # loads PyTorch and transformers
def test_transformers_gives_each_example_alone_the_logits_it_has_in_a_pack(exported_classifier):
    import torch
    import transformers

    model, packed, directory = exported_classifier
    ours = by_example(packed, model({k: tf.constant(v) for k, v in packed.items()})["logits"].numpy())
    theirs = transformers.BertForSequenceClassification.from_pretrained(directory).eval()
    weights = packed["label_weights"].astype(bool)
    rows, slots = np.nonzero(weights)
    for example in range(len(ours)):
        [at] = np.flatnonzero(packed["example_ids"][rows, slots] == example)
        tokens = packed["sequence_ids"][rows[at]] == slots[at] + 1
        with torch.no_grad():
            logits = theirs(input_ids=torch.tensor(packed["input_ids"][rows[at]][tokens][None], dtype=torch.long),
                            token_type_ids=torch.tensor(packed["segment_ids"][rows[at]][tokens][None],
                                                        dtype=torch.long)).logits.numpy()[0]
        np.testing.assert_allclose(logits, ours[example], atol=1e-4, rtol=0)


def classification_update(rows, input_mode, packing_factor, tmp_path, start=None):
    """The weights after two updates of the compiled step, each on every row of `rows` at once."""
    from training_runs import two_fine_tuning_updates

    from bert_packed.training.objective import Classification

    before, after, sums, step = two_fine_tuning_updates(
        rows, input_mode, packing_factor, tmp_path / input_mode,
        lambda config: Classification(config, ("0", "1"), scores=("accuracy", "f1")), start)
    return before, after, step.objective.metrics({key: sums[key] for key in step.objective.sum_keys}), step


@pytest.mark.slow  # compiles and trains packed and one-example-a-row steps (over 3.5 s here)
def test_the_compiled_step_trains_packed_rows_as_it_trains_one_example_a_row(tokenizer, tmp_path):
    packed, alone = classifier_rows(tokenizer)
    start, packed_after, packed_metrics, step = classification_update(packed, "packed", len(SENTENCES) / len(
        packed["input_ids"]), tmp_path)
    assert step.update.sum_keys == ("example_loss", "examples", "example_correct", "tokens", "slots",
                                    "gradient_norm")
    _, alone_after, alone_metrics, _ = classification_update(alone, "padded", 1.0, tmp_path, start)
    assert packed_metrics["num_sequences"] == alone_metrics["num_sequences"] == len(SENTENCES)
    assert packed_metrics["loss"] == pytest.approx(alone_metrics["loss"], rel=1e-6)
    assert packed_metrics["accuracy"] == alone_metrics["accuracy"]
    changed = 0
    for before, a, b in zip(start, packed_after, alone_after, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
        changed += not np.array_equal(a, before)
    assert changed == len([w for w in step.model.trainable_weights])  # every trained weight moved, the rest kept
    # The trained step evaluates each example once, packed or not (batches of 2 rows: the last filled).
    figures = evaluation(step, packed, "packed")
    assert figures["num_sequences"] == len(SENTENCES) and set(figures) == {
        "loss", "num_sequences", "accuracy", "f1", "chance_loss", "chance_accuracy"}
    assert figures["chance_loss"] == pytest.approx(math.log(2)) and figures["chance_accuracy"] >= 0.5
    assert figures == pytest.approx(evaluation(step, alone, "padded"), rel=1e-6)


def evaluation(step, rows, mode):
    from bert_packed.features import Shapes
    from bert_packed.training.input_pipeline import PipelineConfig

    pipeline = PipelineConfig(("train.tsv",), Shapes(48, 0, rows["cls_positions"].shape[1]), mode, batch_size=2,
                              is_training=False, rows=rows)
    return step.evaluate(pipeline)


def test_rows_are_read_each_epoch_whole_and_a_resumed_read_continues_the_same_batches():
    from bert_packed.training.rows_dataset import rows_dataset

    rows = {"example_ids": np.arange(7), "labels": np.arange(7) * 0.5}
    batches = [b["example_ids"].numpy().tolist() for b in rows_dataset(rows, 3, seed=5).take(14)]
    stream = sum(batches, [])
    for epoch in range(6):  # 42 rows read: six epochs, each every row once, each in its own order
        assert sorted(stream[epoch * 7:(epoch + 1) * 7]) == list(range(7))
    assert len({tuple(stream[e * 7:(e + 1) * 7]) for e in range(6)}) > 1
    for first in (1, 2, 5, 9):
        resumed = [b["example_ids"].numpy().tolist() for b in rows_dataset(rows, 3, seed=5, first_batch=first).take(3)]
        assert resumed == batches[first:first + 3]
    assert stream != sum([b["example_ids"].numpy().tolist() for b in rows_dataset(rows, 3, seed=6).take(14)], [])
    labels = [b["labels"].numpy().tolist() for b in rows_dataset(rows, 3, seed=5, is_training=False)]
    assert labels == [[0.0, 0.5, 1.0], [1.5, 2.0, 2.5], [3.0, 0.0, 0.0]]  # filled with empty rows


def test_rows_packed_anew_each_epoch_hold_every_example_once_share_packs_otherwise_and_resume_exactly(tokenizer):
    """--input_mode=packed_online: one plan, every epoch each example once in a pack, the packs'
    company drawn again each epoch, and a read from batch b the uninterrupted read's."""
    from bert_packed.finetuning.encode import RepackedRows
    from bert_packed.training.rows_dataset import rows_dataset

    task = TASKS["sst-2"]
    examples = [read_one(task, SENTENCES[i % len(SENTENCES)] + " " + "a " * (i % 5), None, "1") for i in range(30)]
    encoded = encode_examples(examples, task, task.labels, tokenizer, max_seq_length=32)
    first = assign_to_packs(encoded.lengths, 32, 4, seed=1)
    rows = RepackedRows(encoded, first.plan, 32, 4, seed=1)
    batches = [b for b in rows_dataset(rows, 4, seed=5).take(3 * -(-rows.num_rows // 4) + 2)]
    slots = np.concatenate([b["example_ids"].numpy() for b in batches])  # [rows, S], in stream order
    held = np.concatenate([b["label_weights"].numpy() for b in batches]) > 0
    companies = []
    for epoch in range(3):
        epoch_slots, epoch_held = (a[epoch * rows.num_rows:(epoch + 1) * rows.num_rows] for a in (slots, held))
        assert sorted(epoch_slots[epoch_held].tolist()) == list(range(30))  # every example once an epoch
        companies.append({frozenset(row[mask].tolist()) for row, mask in zip(epoch_slots, epoch_held)})
    assert companies[0] != companies[1] != companies[2]  # other examples share a pack
    for start in (1, 3, 8):
        resumed = [b["example_ids"].numpy().tolist() for b in rows_dataset(rows, 4, seed=5, first_batch=start).take(2)]
        assert resumed == [b["example_ids"].numpy().tolist() for b in batches[start:start + 2]]


def write_mrpc(directory, train_examples=40, dev_examples=12):
    """A small MRPC-like task: pairs of the test sentences, labelled by whether they share a word."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, count in (("train.tsv", train_examples), ("dev.tsv", dev_examples)):
        lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(count):
            a, b = SENTENCES[i % len(SENTENCES)], SENTENCES[(i * 3 + 1) % len(SENTENCES)]
            label = int(bool(set(a.split()) & set(b.split())))
            lines.append(f"{label}\t{i}\t{i + 1000}\t{a}\t{b}")
        (directory / name).write_text("\n".join(lines) + "\n")
    return str(directory)


def test_xla_reaches_the_fine_tuning_run_s_model_and_optimizer(tmp_path, bert_config_file):
    """--xla, as run_pretraining's: the compiled passes and each weight's fused optimizer step
    (tested in tests/test_trainer.py and tests/test_optimizers.py)."""
    from bert_packed.training.batching import batching
    from bert_packed.training.finetune import classifier_run
    from bert_packed.training.finetune_settings import ClassifierSettings
    from bert_packed.training.update import make_optimizer, make_schedule

    settings = dict(task_name="mrpc", data_dir=write_mrpc(tmp_path / "mrpc"), vocab_file=VOCAB,
                    bert_config_file=bert_config_file, output_dir=str(tmp_path / "run"), do_train=True,
                    max_seq_length=64, train_batch_size=8)
    for xla in (False, True):
        run = classifier_run(ClassifierSettings(**settings, xla=xla))
        assert run.config.model.xla is xla and run.config.identity()["xla"] is xla  # run.json's: one --xla a run
        data = run.train_data
        update = batching(run.config, data.input_mode, data.packing_factor, data.shapes.max_sequences_per_pack)
        optimizer = make_optimizer(run.config, update, make_schedule(run.config, update))
        assert type(optimizer).__name__ == "AdamWeightDecay" and optimizer.fused is xla


def test_a_compiled_loop_ends_at_each_evaluation_asked(tmp_path, bert_config_file):
    """--eval_every_samples=16 at 8 examples an update: a loop of 2 updates, whatever
    --iterations_per_loop (1,000 by default, which evaluated a run once, at its end)."""
    from bert_packed.training.finetune import classifier_run
    from bert_packed.training.finetune_settings import ClassifierSettings

    settings = dict(task_name="mrpc", data_dir=write_mrpc(tmp_path / "mrpc"), vocab_file=VOCAB,
                    bert_config_file=bert_config_file, output_dir=str(tmp_path / "run"), do_train=True, do_eval=True,
                    max_seq_length=64, train_batch_size=8)
    assert classifier_run(ClassifierSettings(**settings, eval_every_samples=16)).config.run.iterations_per_loop == 2
    assert classifier_run(ClassifierSettings(**settings, eval_every_samples=16, iterations_per_loop=1)
                          ).config.run.iterations_per_loop == 1
    assert classifier_run(ClassifierSettings(**settings)).config.run.iterations_per_loop == 1000


@pytest.mark.slow  # fine-tunes packed and padded, timed (over 3.5 s here)
def test_the_fine_tuning_benchmark_measures_a_task_of_your_own(tmp_path, bert_config_file):
    from conftest import run_script

    data_dir = write_mrpc(tmp_path / "mrpc")
    result = run_script("benchmark_finetuning", f"--bert_config_file={bert_config_file}", "--task_name=mrpc",
                        f"--data_dir={data_dir}", f"--vocab_file={VOCAB}", "--max_seq_length=64", "--rounds=1",
                        "--updates=1", "--batch_size=8", "--target=0", f"--output_json={tmp_path / 'b.json'}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert set(json.loads((tmp_path / "b.json").read_text())) == {"mrpc"}
    assert re.search(r"^\| mrpc \| packed \| [\d.]+ \|", result.stdout, re.M), result.stdout
    assert re.search(r"^mrpc: packed against padded, real tokens/s: speed-up [\d.]+x .* at real-token ratio "
                     r"[\d.]+: [\d.]+ of it.*\(examples/s [\d.]+x at packing factor [\d.]+\)$", result.stdout, re.M)


@pytest.mark.parametrize("flags, message", [
    (["--task_name=mrpc"], "--task_name and --data_dir go together"),
    (["--task_name=mrpc", "--data_dir=d", "--train_file=t.json"], "give one task of your own"),
    (["--tasks=sst-2"], "--tasks: no task 'sst-2' of the sample's (pronouns, first_year); a task of your own"),
])
def test_the_fine_tuning_benchmark_refuses_a_task_half_given(flags, message):
    from conftest import run_script

    result = run_script("benchmark_finetuning", *flags)
    assert result.returncode == 2 and message in result.stderr and not result.stdout.strip()


@pytest.mark.slow  # fine-tunes packed and padded, timed (over 3.5 s here)
def test_the_fine_tuning_benchmark_says_why_a_speed_up_misses_its_target(tmp_path):
    """scripts/benchmark_finetuning.py: its table, and below --target (here out of reach), exit
    status 1 with a line naming the task, its share of the real-token ratio and what shares an
    update's fixed cost out."""
    from conftest import run_script

    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps({**TINY, "vocab_size": 30522, "max_position_embeddings": 128}))
    result = run_script("benchmark_finetuning", f"--bert_config_file={config}", "--tasks=pronouns", "--sentences=40",
                        "--passages=20", "--rounds=1", "--updates=1", "--batch_size=8", "--target=5",
                        f"--output_json={tmp_path / 'b.json'}")
    assert result.returncode == 1, result.stderr[-2000:]
    measured = json.loads((tmp_path / "b.json").read_text())["pronouns"]
    efficiency = {mode: measured["modes"][mode]["padding_efficiency"][0] for mode in ("padded", "packed")}
    share = measured["token_speedups"]["packed"][0] / (efficiency["packed"] / efficiency["padded"])
    packed = re.search(r"^\| pronouns \| packed \| [\d.]+ \| [\d,]+ \| ([\d.]+)% \| [34]\.\d\d \|", result.stdout,
                       re.M)
    assert packed and float(packed.group(1)) >= 90, result.stdout  # the set is 94.4% real tokens
    assert result.stdout.splitlines()[-1] == (
        f"below --target=5 of the real-token ratio: pronouns {share:.3f}. An update's fixed cost (the optimizer's pass "
        "over every weight) is large beside few packed rows: more examples an update (--batch_size) and --xla "
        "share it out (docs/finetuning.md)")


@pytest.mark.slow  # fine-tunes packed and padded (over 3.5 s here)
def test_run_classifier_fine_tunes_packed_and_its_figures_are_the_padded_run_s(tmp_path, bert_config_file):
    from conftest import run_command

    data_dir = write_mrpc(tmp_path / "mrpc")
    common = ["--task_name=MRPC", f"--data_dir={data_dir}", f"--vocab_file={VOCAB}",
              f"--bert_config_file={bert_config_file}", "--do_train", "--do_eval", "--max_seq_length=64",
              "--train_batch_size=8", "--num_train_epochs=2", "--learning_rate=1e-3", "--iterations_per_loop=3"]
    pretrained = BertPretrainingModel(BertConfig.from_json_file(bert_config_file))
    weights = export_google_checkpoint(pretrained, str(tmp_path / "pretrained" / "bert_model.ckpt"))
    runs = {}
    for mode in ("packed", "padded"):
        result = run_command("run_classifier", *common, f"--input_mode={mode}", f"--output_dir={tmp_path / mode}",
                             f"--init_checkpoint={weights}", f"--export_huggingface_dir={tmp_path / mode}-hf")
        assert result.returncode == 0, result.stderr
        assert f"initialised from {weights}" in result.stderr
        # 40 examples, 2 epochs: 10 updates of 8 rows; packed, whole epochs in updates of round(8 / factor) packs
        [rows] = re.findall(r"train.tsv: 40 examples in (\d+) rows of 64 tokens", result.stderr)
        updates = int(int(rows) / round(8 * int(rows) / 40) * 2)
        assert (updates < 10) == (mode == "packed")
        assert f"run_classifier: trained {updates} updates in {tmp_path / mode}: accuracy " in result.stdout
        runs[mode] = read_log_file(tmp_path / mode / "eval_log.jsonl")
        config = json.loads((tmp_path / f"{mode}-hf" / "config.json").read_text())
        assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {"0": "0",
                                                                                                    "1": "1"}
    for mode, evaluations in runs.items():
        [last] = evaluations
        assert last["num_sequences"] == 12 and last["step"] == len(read_log_file(tmp_path / mode / "train_log.jsonl"))
        assert {"accuracy", "f1", "loss"} <= set(last)
        assert not (tmp_path / mode / "mllog.txt").exists() or "MLLOG" not in (tmp_path / mode / "mllog.txt").read_text()
    train = read_log_file(tmp_path / "packed" / "train_log.jsonl")
    assert len(train) < 10 and sum(r["sequences"] - p["sequences"] for p, r in zip([{"sequences": 0}] + train, train)
                                   ) == train[-1]["sequences"] > 2 * 40 - 8  # two epochs of the 40 but the last part-update
    assert train[-1]["padding_efficiency"] > read_log_file(tmp_path / "padded" / "train_log.jsonl")[-1][
        "padding_efficiency"]
    # The fine-tuned weights evaluate alone (google-research's --do_eval --init_checkpoint=its model.ckpt-N) to
    # the run's last figures, packed or not; the run's directory refuses other epochs.
    evaluated = run_command("run_classifier", *[f for f in common if f != "--do_train"], "--input_mode=padded",
                            f"--init_checkpoint={tmp_path / 'packed' / f'model.ckpt-{len(train)}'}",
                            f"--output_dir={tmp_path / 'e'}")
    assert evaluated.returncode == 0, evaluated.stderr
    figures = runs["packed"][0]
    assert f"accuracy {figures['accuracy']:.4f}, f1 {figures['f1']:.4f}, loss {figures['loss']:.4f}" in evaluated.stdout
    longer = run_command("run_classifier", *common, "--num_train_epochs=3", f"--output_dir={tmp_path / 'packed'}")
    assert longer.returncode == 2 and "num_train_epochs" in longer.stderr, longer.stderr


def read_log_file(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def classifier_flags(tmp_path, bert_config_file, output_dir, *more):
    return ["--task_name=mrpc", f"--data_dir={tmp_path / 'mrpc'}", f"--vocab_file={VOCAB}",
            f"--bert_config_file={bert_config_file}", "--max_seq_length=64", "--train_batch_size=8",
            "--num_train_epochs=2", "--learning_rate=1e-3", "--iterations_per_loop=2", "--do_train", "--do_eval",
            f"--output_dir={tmp_path / output_dir}", *more]


def without_clocks(records):
    return [{k: v for k, v in record.items() if "seconds" not in k} for record in records]


@pytest.mark.slow  # fine-tunes, stops by a signal and resumes (over 3.5 s here)
def test_a_fine_tuning_run_stopped_by_a_signal_resumes_to_the_uninterrupted_run_s_logs(tmp_path, bert_config_file,
                                                                                          monkeypatch):
    import signal

    from conftest import run_command

    from bert_packed.training.step import CompiledStep

    write_mrpc(tmp_path / "mrpc")
    whole = run_command("run_classifier", *classifier_flags(tmp_path, bert_config_file, "whole"))
    assert whole.returncode == 0, whole.stderr
    run_updates = CompiledStep.run_updates

    def then_sigterm(step, iterator, num_updates):
        results = run_updates(step, iterator, num_updates)
        if int(step.step) == 4:  # the second loop of two updates has run: the run stops after it
            os.kill(os.getpid(), signal.SIGTERM)
        return results

    monkeypatch.setattr(CompiledStep, "run_updates", then_sigterm)
    stopped = run_command("run_classifier", *classifier_flags(tmp_path, bert_config_file, "stopped"))
    assert stopped.returncode == 75, stopped.stderr
    assert "stopped by SIGTERM after saving step" in stopped.stderr and "the same command resumes" in stopped.stderr
    monkeypatch.setattr(CompiledStep, "run_updates", run_updates)
    resumed = run_command("run_classifier", *classifier_flags(tmp_path, bert_config_file, "stopped"))
    assert resumed.returncode == 0 and "resumed from" in resumed.stderr, resumed.stderr
    for log in ("train_log.jsonl", "eval_log.jsonl"):
        assert without_clocks(read_log_file(tmp_path / "stopped" / log)) == without_clocks(
            read_log_file(tmp_path / "whole" / log))


@pytest.mark.parametrize("change, message", [
    (lambda tmp: (tmp / "mrpc" / "dev.tsv").write_text("header\n1\t2\tno second text\n"),
     "mrpc/dev.tsv:2: 3 tab-separated columns; mrpc expects 5"),
    (lambda tmp: (tmp / "mrpc" / "train.tsv").unlink(), "mrpc/train.tsv"),
    (lambda tmp: None, "at least one of --do_train, --do_eval or --do_predict must be given"),
    (lambda tmp: None, "--task_name=squad: expected one of cola"),
    (lambda tmp: None, "--max_seq_length=512: above the BERT config's max_position_embeddings=128"),
    (lambda tmp: None, "--num_train_epochs=inf: must be above 0"),
    (lambda tmp: None, "--num_gpus=2: cannot be honoured, 0 GPUs are visible"),
    (lambda tmp: None, "--all_reduce_alg=ring applies to --distribution_strategy=mirrored (--num_gpus) or "
                       "multi_worker_mirrored, not default"),
    (lambda tmp: None, "--precision=fp8: value should be one of <fp32|bf16|fp16>"),
])
def test_run_classifier_refuses_bad_input_in_one_line_before_any_file_is_written(tmp_path, bert_config_file, change,
                                                                                   message):
    from conftest import run_command

    write_mrpc(tmp_path / "mrpc")
    change(tmp_path)
    flags = classifier_flags(tmp_path, bert_config_file, "out")
    if "do_train" in message:
        flags = [f for f in flags if f not in ("--do_train", "--do_eval")]
    if "squad" in message:
        flags[0] = "--task_name=squad"
    if "max_seq_length" in message:
        flags[4] = "--max_seq_length=512"
    if "inf" in message:
        flags[6] = "--num_train_epochs=inf"
    flags += [f"--{name}" for name in ("num_gpus=2", "all_reduce_alg=ring", "precision=fp8") if f"--{name}" in message]
    result = run_command("run_classifier", *flags)
    assert result.returncode == 2, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("run_classifier: ")]
    assert message in line and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # fine-tunes three runs (over 3.5 s here)
def test_fine_tuning_takes_pre_training_s_precision_and_recompute_as_a_python_function(tmp_path, bert_config_file):
    """run_classifier(settings) as a notebook calls it: bf16 with each layer recomputed trains
    and evaluates as fp32 does, within bf16's rounding; recompute alone changes no figure. The
    caller's precision and Python logging (a notebook's root logger: WARNING, no handler) are as they
    were afterwards."""
    import logging

    from conftest import STEPS

    from bert_packed.training.finetune import run_classifier
    from bert_packed.training.finetune_settings import ClassifierSettings

    write_mrpc(tmp_path / "mrpc")
    given = dict(task_name="mrpc", data_dir=str(tmp_path / "mrpc"), vocab_file=VOCAB, bert_config_file=bert_config_file,
                 max_seq_length=64, train_batch_size=8, num_train_epochs=2, learning_rate=1e-3, do_train=True,
                 do_eval=True)
    root = logging.getLogger()
    pytest_s = (root.level, list(root.handlers))
    root.setLevel(logging.WARNING)  # a notebook's: no handler, WARNING; a run logs at INFO meanwhile
    root.handlers[:] = []
    try:
        results = {name: run_classifier(ClassifierSettings(**given, output_dir=str(tmp_path / name), **values), STEPS)
                   for name, values in (("fp32", {}), ("fp32_recomputed", dict(recompute="layer")),
                                        ("bf16_recomputed", dict(precision="bf16", recompute="layer")))}
        logging_after = (root.level, list(root.handlers))
    finally:
        root.setLevel(pytest_s[0])
        root.handlers[:] = pytest_s[1]
    assert logging_after == (logging.WARNING, [])  # not every library's INFO lines from now on
    fp32 = results["fp32"]
    assert fp32.run.step == 8 and fp32.run.stopped_by is None and fp32.directory.path == str(tmp_path / "fp32")
    assert set(fp32.evaluation) >= {"accuracy", "f1", "loss"} and fp32.figures.startswith("accuracy ")
    losses = {name: [r["loss"] for r in read_log_file(tmp_path / name / "train_log.jsonl")] for name in results}
    assert losses["fp32_recomputed"] == pytest.approx(losses["fp32"], rel=1e-5)
    assert results["fp32_recomputed"].evaluation["loss"] == pytest.approx(fp32.evaluation["loss"], rel=1e-5)
    assert losses["bf16_recomputed"][0] == pytest.approx(losses["fp32"][0], rel=2e-2)
    assert results["bf16_recomputed"].evaluation["loss"] == pytest.approx(fp32.evaluation["loss"], rel=5e-2)
    import keras

    assert keras.mixed_precision.global_policy().name == "float32"  # the caller's, put back after the bf16 run
    recorded = json.loads((tmp_path / "bf16_recomputed" / "run.json").read_text())
    assert (recorded["precision"], recorded["task_name"]) == ("bf16", "mrpc")  # recompute may change on resume


TWO_REPLICAS = r"""
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from bert_packed.training import finetune
from bert_packed.training.finetune import run_classifier
from bert_packed.training.finetune_settings import ClassifierSettings
given = json.loads(sys.argv[1])
out = {}
for devices in (1, 2):
    # Two CPU devices stand for a host's GPUs: --distribution_strategy=mirrored mirrors over them.
    finetune.make_strategy = lambda settings, cluster: tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(devices)])
    result = run_classifier(ClassifierSettings(**given, output_dir=f"{sys.argv[2]}/{devices}",
                                               distribution_strategy="mirrored"))
    reader = tf.train.load_checkpoint(f"{sys.argv[2]}/{devices}/checkpoints")
    out[devices] = {"evaluation": result.evaluation, "train": result.run.record,
                    "log": [(r["loss"], r["gradient_norm"]) for r in result.directory.read_log("train_log.jsonl")], "weights": {
        name: reader.get_tensor(name).tolist() for name in reader.get_variable_to_shape_map()
        if name.startswith("optimizer/_trainable_variables/")}}
print(json.dumps(out))
"""


@pytest.mark.slow  # a process of its own with two CPU devices (about 15 s here)
def test_a_fine_tuning_run_on_two_replicas_makes_the_updates_of_one(tmp_path):
    """--distribution_strategy=mirrored, as pre-training's: the same rows split over two replicas
    give the same updates, evaluation and figures as on one (dropout off: each replica draws its
    own masks). Packs hold unequal counts of examples, so the update is the mean over all of them
    and its clip the whole gradient's, as google-research's on one device."""
    import subprocess
    import sys

    from conftest import REPO, TINY

    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps({**TINY, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0, "type_vocab_size": 2,
                                  "initializer_range": 0.02}))
    given = dict(task_name="mrpc", data_dir=write_mrpc(tmp_path / "mrpc"), vocab_file=VOCAB, bert_config_file=str(config),
                 max_seq_length=64, train_batch_size=12, eval_batch_size=4, num_train_epochs=1, learning_rate=1e-3,
                 do_train=True, do_eval=True)
    done = subprocess.run([sys.executable, "-c", TWO_REPLICAS, json.dumps(given), str(tmp_path / "runs")], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = json.loads(done.stdout.strip().splitlines()[-1]).values()
    # 12 examples an update: 4 packs, 2 a replica (a packed batch is whole packs, a multiple of the replicas).
    assert (one["train"]["step"], one["train"]["sequences"]) == (two["train"]["step"], two["train"]["sequences"]) == (3, 36)
    # Each update's loss and gradient norm: the mean over all its examples, whichever replica holds them.
    np.testing.assert_allclose(two["log"], one["log"], rtol=1e-6)
    assert two["evaluation"]["num_sequences"] == one["evaluation"]["num_sequences"] == 12
    for name in ("loss", "accuracy", "f1"):
        assert two["evaluation"][name] == pytest.approx(one["evaluation"][name], rel=1e-6), name
    assert len(one["weights"]) == 19  # the tiny encoder's, its pooler's and the classifier's
    for name, value in one["weights"].items():
        np.testing.assert_allclose(two["weights"][name], value, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("given, message", [
    (dict(train_batch_size="8"), "--train_batch_size='8': a str; expected an integer"),
    (dict(xla="false"), "--xla='false': a str; expected True or False"),
    (dict(distribution_strategy="mirror"), "--distribution_strategy=mirror: expected one of default, mirrored"),
    (dict(input_mode="pack"), "--input_mode=pack: expected one of packed, padded, packed_online"),
    (dict(cluster_resolver="slurm"), "--cluster_resolver=slurm applies to --distribution_strategy="
                                     "multi_worker_mirrored, not default"),
    (dict(all_reduce_alg="nccl"), "--all_reduce_alg=nccl applies to --distribution_strategy=mirrored"),
    (dict(use_tpu=True, tpu="a", tpu_name="b"), "--tpu=a and --tpu_name=b disagree; give one of them"),
    (dict(bert_config_file=None), "--bert_config_file is required"),
])
def test_settings_built_in_python_are_refused_as_the_command_line_refuses_them(tmp_path, given, message):
    """A notebook gives no `given` and no flag parser checks its types: each refusal is still a
    SettingsError (one line, naming the flag), before any file is read."""
    from bert_packed.errors import SettingsError
    from bert_packed.training.finetune_settings import ClassifierSettings

    values = dict(task_name="mrpc", data_dir=str(tmp_path), bert_config_file="bert_config.json", do_train=True,
                  output_dir=str(tmp_path / "out"))
    with pytest.raises(SettingsError, match=re.escape(message)):
        ClassifierSettings(**{**values, **given})


def test_a_python_caller_s_mistakes_are_said_before_any_work(tmp_path):
    """A step count given for the step pool, a setting misspelled or of another type: refused at
    once, in one line, before any file is read."""
    from bert_packed.errors import SettingsError
    from bert_packed.training.finetune import run_classifier
    from bert_packed.training.finetune_settings import ClassifierSettings
    from bert_packed.training.pretraining import PretrainingSettings, run_pretraining

    settings = ClassifierSettings(task_name="mrpc", data_dir=str(tmp_path / "nowhere"), bert_config_file="none.json",
                                  do_train=True, output_dir=str(tmp_path / "out"))
    with pytest.raises(TypeError, match=r"^step_pool=10: expected a StepPool"):
        run_classifier(settings, 10)
    with pytest.raises(SettingsError, match=r"^--num_train_steps='10': a str; expected an integer$"):
        PretrainingSettings.of(num_train_steps="10")
    with pytest.raises(SettingsError, match=r"^--bert_config_fil: run_pretraining has no such setting$"):
        PretrainingSettings.of(bert_config_fil="x")
    with pytest.raises(TypeError, match=r"^step_pool=100: expected a StepPool"):
        run_pretraining(PretrainingSettings.of(output_dir=str(tmp_path / "p")), 100)
    assert not (tmp_path / "out").exists() and not (tmp_path / "p").exists()


def write_mrpc_test(directory, count=10):
    """MRPC's test.tsv layout: an index and the two sentences' ids and texts, no label."""
    lines = ["index\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    lines += [f"{i}\t{i}\t{i + 1000}\t{SENTENCES[i % len(SENTENCES)]}\t{SENTENCES[(i * 5 + 2) % len(SENTENCES)]}"
              for i in range(count)]
    (directory / "test.tsv").write_text("\n".join(lines) + "\n")


def test_a_test_file_is_read_without_labels_in_its_task_s_test_layout(tmp_path):
    """GLUE's test files (an index first, a header, no label) and a jsonl task's test.jsonl (a
    label there is not read); a line of another layout is named with its file and line."""
    from bert_packed.finetuning.tasks import TASKS, TaskDataError, read_examples

    write_mrpc_test(tmp_path, 3)
    examples = read_examples(TASKS["mrpc"], str(tmp_path / "test.tsv"), test=True)
    assert [(e.text, e.text_pair, e.label, e.line) for e in examples][0] == (SENTENCES[0], SENTENCES[2], None, 2)
    assert len(examples) == 3 and TASKS["mnli"].test_file == "test_matched.tsv"
    (tmp_path / "sst.tsv").write_text("index\tsentence\n0\ta fine film\n")
    assert read_examples(TASKS["sst-2"], str(tmp_path / "sst.tsv"), test=True)[0].text == "a fine film"
    (tmp_path / "test.jsonl").write_text('{"text": "one"}\n{"text": "two", "text_pair": "three", "label": 7}\n')
    assert [(e.text, e.text_pair, e.label) for e in read_examples(TASKS["jsonl"], str(tmp_path / "test.jsonl"),
                                                                   ("a", "b"), test=True)] == [
        ("one", None, None), ("two", "three", None)]
    (tmp_path / "bad.tsv").write_text("index\tsentence\n0\ta\tb\n")
    with pytest.raises(TaskDataError, match="bad.tsv:2: 3 tab-separated columns; sst-2 expects 2 in its test file"):
        read_examples(TASKS["sst-2"], str(tmp_path / "bad.tsv"), test=True)


@pytest.mark.slow  # fine-tunes, then predicts again one example a row (over 3.5 s here)
def test_do_predict_writes_each_test_example_s_probabilities_the_same_packed_or_padded(tmp_path, bert_config_file):
    """google-research's --do_predict: test_results.tsv, a line of class probabilities for each
    example of test.tsv in its order, by the newest checkpoint: after training (packed), and by a
    command that only predicts (padded), the same to float rounding."""
    from conftest import run_command

    write_mrpc(tmp_path / "mrpc")
    write_mrpc_test(tmp_path / "mrpc")
    trained = run_command("run_classifier", *classifier_flags(tmp_path, bert_config_file, "run", "--do_predict"))
    assert trained.returncode == 0, trained.stderr
    results = tmp_path / "run" / "test_results.tsv"
    assert f"run_classifier: predicted the 10 examples of the test file -> {results}" in trained.stdout
    packed = np.loadtxt(results, delimiter="\t")
    assert packed.shape == (10, 2) and np.allclose(packed.sum(axis=1), 1.0, atol=1e-6)
    assert len(set(np.round(packed[:, 0], 6))) > 1  # each example its own
    flags = [flag for flag in classifier_flags(tmp_path, bert_config_file, "run", "--do_predict",
                                               "--input_mode=padded", "--predict_batch_size=3")
             if flag not in ("--do_train", "--do_eval")]
    predicted = run_command("run_classifier", *flags)
    assert predicted.returncode == 0, predicted.stderr
    assert predicted.stdout.strip() == f"run_classifier: predicted the 10 examples of the test file -> {results}"
    np.testing.assert_allclose(np.loadtxt(results, delimiter="\t"), packed, atol=1e-6)


@pytest.mark.slow  # fine-tunes a run (over 3.5 s here)
def test_a_run_that_stays_at_chance_says_so_at_its_end(tmp_path, bert_config_file):
    """At a learning rate far too high the tiny model's classifier ends answering the commonest
    class of the dev set at every evaluation: its ordinary success line is followed by one warning
    line."""
    from conftest import run_command

    write_mrpc(tmp_path / "mrpc")
    result = run_command("run_classifier", *classifier_flags(tmp_path, bert_config_file, "collapsed",
                                                             "--learning_rate=1.0", "--eval_every_samples=8",
                                                             "--num_train_epochs=4"))
    assert result.returncode == 0, result.stderr
    evaluations = read_log_file(tmp_path / "collapsed" / "eval_log.jsonl")
    assert len(evaluations) >= 12 and all(r["accuracy"] == r["chance_accuracy"] for r in evaluations[-6:])
    assert evaluations[-1]["chance_loss"] == pytest.approx(np.log(2))
    warning = result.stderr.strip().splitlines()[-1]
    assert warning.startswith(f"warning: {tmp_path / 'collapsed'}: its last ") and "stayed at chance (accuracy " in warning
    assert "it learned nothing" in warning and "try a lower --learning_rate" in warning


def test_a_task_file_s_identity_is_all_of_it(tmp_path):
    """A fine-tuning file is read whole: a label flipped past its first 64 KiB, the size the same,
    is another file (record files keep the size and first 64 KiB, read in parts)."""
    from bert_packed.inputs.file_identity import FileIdentity

    path = tmp_path / "train.jsonl"
    lines = [json.dumps({"text": f"sentence number {i:05d}", "label": "pos" if i % 2 else "neg"}) for i in range(3000)]
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 2 * 2**16
    before, head_only = FileIdentity.of(str(path), whole=True), FileIdentity.of(str(path))
    path.write_text("\n".join(lines[:-1] + [lines[-1].replace('"label": "pos"', '"label": "neg"')]) + "\n")
    assert FileIdentity.of(str(path), whole=True) != before and before.difference() == (
        "its content is other (the SHA-256 of all of it)")
    assert head_only.difference() is None  # what a record file's identity sees of the same edit


@pytest.mark.slow  # fine-tunes a run (over 3.5 s here)
def test_a_finished_fine_tuning_run_refuses_its_task_file_changed_past_its_first_64_kib(tmp_path, bert_config_file):
    from conftest import run_command

    from bert_packed.inputs.file_identity import FileIdentity

    data = tmp_path / "task"
    data.mkdir()
    lines = [json.dumps({"text": f"word{i % 50} and more", "label": "a" if i % 3 else "b"}) for i in range(3000)]
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")
    (data / "dev.jsonl").write_text("\n".join(lines[:20]) + "\n")
    flags = ["--task_name=jsonl", f"--data_dir={data}", f"--vocab_file={VOCAB}", f"--bert_config_file={bert_config_file}",
             "--max_seq_length=32", "--train_batch_size=64", "--num_train_epochs=1", "--do_train",
             f"--output_dir={tmp_path / 'run'}"]
    assert run_command("run_classifier", *flags).returncode == 0
    # A run an earlier version began recorded the file's first 64 KiB: it is checked on those.
    run_json = tmp_path / "run" / "run.json"
    recorded = json.loads(run_json.read_text())
    assert recorded["train_files"][0][2].startswith("all:")
    recorded["train_files"][0][2] = FileIdentity.of(str(data / "train.jsonl")).head
    run_json.write_text(json.dumps(recorded))
    again = run_command("run_classifier", *flags)
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr[-2000:]
    assert "begun by an earlier bert-packed, which recorded the first 64 KiB of its train files" in again.stderr
    run_json.write_text(json.dumps({**recorded, "train_files": [[*recorded["train_files"][0][:2], "0" * 64]]}))
    assert run_command("run_classifier", *flags).returncode == 2  # its first 64 KiB others
    recorded["train_files"][0][2] = FileIdentity.of(str(data / "train.jsonl"), whole=True).head
    run_json.write_text(json.dumps(recorded))
    flipped = lines[:-1] + [lines[-1].replace('"a"', '"x"').replace('"b"', '"a"').replace('"x"', '"b"')]
    (data / "train.jsonl").write_text("\n".join(flipped) + "\n")  # the same size, the last line's label flipped
    result = run_command("run_classifier", *flags)
    assert result.returncode == 2 and "nothing to do" not in result.stderr, result.stderr[-2000:]
    assert "train.jsonl" in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
    # Evaluating the finished run needs no train.jsonl: the run recorded its labels.
    (data / "train.jsonl").unlink()
    evaluating = [flag for flag in flags if flag != "--do_train"] + ["--do_eval"]
    result = run_command("run_classifier", *evaluating)
    assert result.returncode == 0 and "run_classifier: evaluated " in result.stdout, result.stderr[-2000:]
    result = run_command("run_classifier", *evaluating[:-2], f"--output_dir={tmp_path / 'other'}", "--do_eval")
    assert result.returncode == 2 and "train.jsonl: not there; a jsonl task's classes are its training file's" in (
        result.stderr), result.stderr[-2000:]
    # export_model writes pre-training's heads: a fine-tuned run is pointed to its own export.
    result = run_command("export_model", f"--checkpoint={tmp_path / 'run'}", f"--bert_config_file={bert_config_file}",
                         f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'exported'}")
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"export_model: error: --checkpoint={tmp_path / 'run'}: a run_classifier run; it exports with its own head: "
        f"run the same run_classifier command with --export_huggingface_dir=DIR (a finished run exports at once, "
        f"nothing trained again)"), result.stderr[-2000:]
    exported = str(next((tmp_path / "run").glob("model.ckpt-*.index"))).removesuffix(".index")  # its weights alone
    result = run_command("export_model", f"--checkpoint={exported}", f"--bert_config_file={bert_config_file}",
                         f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'exported'}")
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].endswith(
        "fine-tuned weights (a task's head); this command writes pre-training's heads: a fine-tuning run exports "
        "with its own, its command with --export_huggingface_dir=DIR"), result.stderr[-2000:]
    assert not (tmp_path / "exported").exists()


def test_a_carriage_return_inside_a_text_is_whitespace_and_carriage_return_line_ends_are_named(tmp_path):
    """A stray \r in a GLUE text crashed run_classifier (csv's "new-line character seen in
    unquoted field", an internal error); a file whose lines end with \r alone read as one line."""
    path = tmp_path / "train.tsv"
    path.write_bytes(b"sentence\tlabel\nit was\rsunny\t1\nrain\t0\n")
    assert [(e.text, e.label) for e in read_examples(TASKS["sst-2"], str(path))] == [("it was sunny", "1"), ("rain", "0")]
    path.write_bytes(b"sentence\tlabel\rit was sunny\t1\rrain\t0\r")
    with pytest.raises(TaskDataError, match=r"train.tsv: its lines end with a carriage return alone .* expected lines "
                                            r"ending with \\n or \\r\\n"):
        read_examples(TASKS["sst-2"], str(path))
