"""SQuAD fine-tuning: the files read and refused as google-research reads them, contexts cut into
windows as its run_squad cuts them, answers picked and scored as it and the official script do,
and packed rows giving each window the span logits, loss and gradients it gets alone."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import REAL_VOCAB, TINY, VOCAB, run_command

from bert_packed.finetuning.encode import make_rows
from bert_packed.finetuning.squad import (
    SquadExample,
    make_windows,
    predict_answers,
    read_squad_examples,
    squad_scores,
)
from bert_packed.finetuning.tasks import TaskDataError
from bert_packed.model import BertConfig, BertPretrainingModel, BertQuestionAnsweringModel, export_google_checkpoint
from bert_packed.model.task_models import OUTSIDE_THE_SEQUENCE
from bert_packed.packing.assign import assign_to_packs
from bert_packed.pretraining_data.tokenization import Tokenizer
from bert_packed.training.losses import span_sums

SENTENCES = ["the cat sat on the mat .", "it was a sunny day .", "paris is the capital of france .",
             "he said that it would rain , but it did not rain at all that day .", "a dog barked twice .",
             "the history of the city begins in the year one thousand .", "she left early ."]


def squad_json(num_paragraphs, questions_per_paragraph=2, sentences_per_context=3):
    """A SQuAD v1.1 file's JSON whose answers the text determines: "what comes after W ?" is
    answered by the word after W in the context (W's first occurrence)."""
    paragraphs = []
    for p in range(num_paragraphs):
        context = " ".join(SENTENCES[(p + k * 2) % len(SENTENCES)] for k in range(sentences_per_context))
        words = context.split(" ")
        qas = []
        for q in range(questions_per_paragraph):
            i = (p * 5 + q * 3) % (len(words) - 1)
            while words.index(words[i]) != i:
                i = (i + 1) % (len(words) - 1)
            start = len(" ".join(words[:i + 1])) + 1
            qas.append({"id": f"p{p}q{q}", "question": f"what comes after {words[i]} ?",
                        "answers": [{"text": words[i + 1], "answer_start": start}]})
        paragraphs.append({"context": context, "qas": qas})
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


def write_squad(path, num_paragraphs, **kwargs):
    path.write_text(json.dumps(squad_json(num_paragraphs, **kwargs), indent=1))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(VOCAB)


def test_each_window_holds_the_question_and_its_stretch_of_context_and_each_token_is_scored_once(tokenizer, tmp_path):
    path = write_squad(tmp_path / "train.json", 6, sentences_per_context=5)
    examples = read_squad_examples(path, training=True)
    windows = make_windows(examples, tokenizer, max_seq_length=28, doc_stride=5, max_query_length=12, path=path)
    assert len(windows.encoded.input_ids) > 2 * len(examples)  # long contexts: several windows each
    for index, example in enumerate(examples):
        question = tokenizer.encode([example.question])[0]
        context, offsets = tokenizer.encode_with_offsets([example.context])[0]
        mine = np.flatnonzero(windows.example_index == index)
        scored = np.zeros(len(context), int)
        first = len(question) + 2
        starts = []
        for window in mine:
            ids, spans = windows.encoded.input_ids[window], windows.spans[window]
            assert len(ids) <= 28 and ids[0] == tokenizer.cls_id and ids[first - 1] == ids[-1] == tokenizer.sep_id
            assert ids[1:first - 1].tolist() == question.tolist()
            where = [int(np.flatnonzero((offsets == span).all(1))[0]) for span in spans[first:-1]]
            assert where == list(range(where[0], where[0] + len(where)))  # a stretch of the context, in order
            assert ids[first:-1].tolist() == context[where[0]:where[-1] + 1].tolist()
            starts.append(where[0])
            scored[np.array(where)[windows.max_context[window][first:-1]]] += 1
            assert not windows.max_context[window][:first].any() and (spans[:first] == -1).all()
            start, end = (windows.encoded.targets[name][window] for name in ("start_positions", "end_positions"))
            text, answer_start = example.answers[0]
            if start:  # the answer, cut from the context by its tokens' characters
                assert example.context[spans[start, 0]:spans[end, 1]] == text
            else:  # the window does not hold it
                assert end == 0 and not (spans[first:-1, 0] <= answer_start).all() & (
                    spans[first:-1, 1] >= answer_start + len(text)).any()
        assert starts == list(range(0, 5 * len(starts), 5)) and where[-1] == len(context) - 1
        assert (scored == 1).all()  # every context token scored in exactly one window
    held = windows.encoded.targets["start_positions"] > 0
    assert {int(i) for i in windows.example_index[held]} == set(range(len(examples)))


def test_a_token_is_scored_in_the_window_where_it_has_the_most_context():
    """The docstring's case: 10 context tokens, windows of 5 at stride 3 ([0-4] [3-7] [6-9])."""
    from bert_packed.finetuning.squad import _best_windows, _window_starts

    starts = _window_starts(10, 5, 3)
    assert starts == [0, 3, 6]
    assert _best_windows(starts, 5, 10).tolist() == [0, 0, 0, 0, 3, 3, 3, 6, 6, 6]
    assert _window_starts(0, 5, 3) == [0] and _window_starts(5, 5, 3) == [0]


def test_the_answer_is_the_best_kept_span_of_the_n_best_starts_and_ends():
    tokenizer = Tokenizer(REAL_VOCAB)  # a token a word
    example = SquadExample("q", "what comes after cat ?", "the cat sat on the mat .", (("sat", 8),), 1)
    windows = make_windows([example], tokenizer, max_seq_length=32, doc_stride=4, max_query_length=12, path="dev.json")
    [spans] = windows.spans
    first = int(np.flatnonzero(spans[:, 0] >= 0)[0])  # "the"
    start_logits, end_logits = np.full((1, 32), -5.0), np.full((1, 32), -5.0)
    start_logits[0, 0] = end_logits[0, 0] = 9.0  # the [CLS]: off the context, never an answer
    start_logits[0, [first, first + 3]] = 3.5, 4.0  # "the" (cat), "on"
    end_logits[0, [first + 1, first + 5]] = 4.0, 5.0  # "cat", "mat"; "on" .. "cat" ends before it starts
    answers, nbest = predict_answers([example], windows, start_logits, end_logits, n_best_size=3, max_answer_length=6)
    assert answers == {"q": "on the mat"}
    assert [entry["text"] for entry in nbest["q"]] == ["on the mat", "the cat sat on the mat", "the cat"]
    assert sum(entry["probability"] for entry in nbest["q"]) == pytest.approx(1.0)
    assert nbest["q"][0]["probability"] == pytest.approx(1 / (1 + np.exp(-0.5) + np.exp(-1.5)))
    answers, _ = predict_answers([example], windows, start_logits, end_logits, n_best_size=3, max_answer_length=2)
    assert answers == {"q": "the cat"}
    assert predict_answers([example], windows, start_logits, end_logits, 1, 30)[0] == {"q": ""}  # the [CLS] alone


def test_scores_are_the_official_script_s():
    def example(qas_id, *truths):
        return SquadExample(qas_id, "?", "", tuple((truth, 0) for truth in truths), 1)

    examples = [example("a", "The Eiffel Tower", "Eiffel Tower"), example("b", "in 1889"), example("c", "Paris")]
    scores = squad_scores(examples, {"a": "eiffel tower!", "b": "1889 , in paris"})  # "c" unanswered: 0
    # a: exact (articles and punctuation aside); b: F1 of 2 common tokens, precision 2/3, recall 1: 0.8
    assert scores == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 0.8) / 3})


@pytest.mark.parametrize("change, message", [
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][0]["answers"][0].update(answer_start=3),
     "train.json:36: question 'p1q0': the answer 'he' is not at its answer_start 3 (the context there reads 'wa')"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(question="what " * 30 + "?"),
     "train.json:21: question 'p0q1' is 31 tokens, above --max_query_length=16: raise it (run_squad's default is 64)"),
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][1].update(answers=[]),
     "train.json:46: question 'p1q1' has no answer: each training question needs one (SQuAD v1.1)"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(is_impossible=True),
     "train.json:11: question 'p0q0' has no answer (is_impossible, SQuAD 2.0): SQuAD v1.1's questions only"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(answers=[None]),
     "train.json:11: question 'p0q0': an answer without a \"text\" and an \"answer_start\" of 0 or more"),
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][0]["answers"][0].update(answer_start=-4),
     "train.json:36: question 'p1q0': an answer without a \"text\" and an \"answer_start\" of 0 or more"),
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][0]["answers"][0].update(answer_start=True),  # read as 1
     "train.json:36: question 'p1q0': an answer without a \"text\" and an \"answer_start\" of 0 or more"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(question="  "),  # was trained on
     "train.json:21: question 'p0q1': its \"question\" is empty; expected the question's text"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(answers={"text": "cat"}),
     "train.json:11: question 'p0q0': \"answers\" is not a list"),
    (lambda d: d["data"][0]["paragraphs"][1]["qas"][1].update(id="p0q0"),
     "train.json:46: question id 'p0q0' is given twice (line 11 too): predictions.json keys each answer by its id"),
    (lambda d: d["data"][0]["paragraphs"][1].pop("context"),
     "train.json: paragraph 2: expected {\"context\": a text, \"qas\": [questions]}"),
    (lambda d: d.pop("data"), "train.json: not a SQuAD file: expected {\"data\": [{\"paragraphs\": [...]}]}"),
    (lambda d: d["data"].clear(), "train.json: no question; expected a SQuAD v1.1 JSON file"),
])
def test_bad_squad_input_is_named_with_its_file_and_line(tokenizer, tmp_path, change, message):
    data = squad_json(2)
    change(data)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data, indent=1))
    with pytest.raises(TaskDataError) as raised:
        make_windows(read_squad_examples(str(path), training=True), tokenizer, 64, 16, 16, str(path))
    assert str(raised.value) == f"{tmp_path}/{message}"


def test_a_squad_file_that_is_not_utf8_is_named_by_its_line(tmp_path):
    path = tmp_path / "train.json"
    text = json.dumps(squad_json(2), indent=1).encode()
    at = text.index(b'"context": "') + len(b'"context": "')
    path.write_bytes(text[:at] + b"caf\xe9 " + text[at:])  # Latin-1's e acute
    line = text[:at].count(b"\n") + 1
    with pytest.raises(TaskDataError, match=rf"train.json:{line}: not UTF-8 \(byte 0xe9\); expected a SQuAD v1.1"):
        read_squad_examples(str(path))


def test_a_paragraph_without_questions_is_passed_over_and_a_directory_is_refused(tmp_path):
    data = squad_json(2)
    data["data"][0]["paragraphs"][0]["qas"] = []
    (tmp_path / "dev.json").write_text(json.dumps(data))
    assert [e.qas_id for e in read_squad_examples(str(tmp_path / "dev.json"))] == ["p1q0", "p1q1"]
    with pytest.raises(TaskDataError, match=rf"^{tmp_path}: a directory; expected a SQuAD v1.1 JSON file$"):
        read_squad_examples(str(tmp_path))


def test_a_file_that_is_not_json_is_named_with_its_line(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text('{"data": [\n{"paragraphs": [}\n]}')
    with pytest.raises(TaskDataError, match=rf"^{path}:2: not JSON \(.*\); expected a SQuAD v1.1 JSON file$"):
        read_squad_examples(str(path))


@pytest.fixture(scope="module")
def squad_file(tmp_path_factory):
    return write_squad(tmp_path_factory.mktemp("squad") / "train.json", 8, sentences_per_context=2)


def span_rows(tokenizer, path, depth):
    windows = make_windows(read_squad_examples(path, training=True), tokenizer, max_seq_length=64, doc_stride=16,
                           max_query_length=12, path=path)
    return windows, make_rows(windows.encoded, assign_to_packs(windows.encoded.lengths, 64, depth, seed=3), 64, depth)


def by_window(rows, values):
    """{window: value of its slot} over rows' filled slots."""
    held = rows["label_weights"] > 0
    return dict(zip(rows["example_ids"][held].tolist(), np.asarray(values)[held]))


def test_packed_rows_give_each_window_its_own_span_logits_loss_and_gradients(tokenizer, squad_file):
    windows, packed = span_rows(tokenizer, squad_file, depth=4)
    _, alone = span_rows(tokenizer, squad_file, depth=1)
    assert packed["input_ids"].shape[0] < alone["input_ids"].shape[0]
    model = BertQuestionAnsweringModel(BertConfig(**TINY))
    results = {}
    for name, rows in (("packed", packed), ("alone", alone)):
        features = {key: tf.constant(value) for key, value in rows.items()}
        with tf.GradientTape() as tape:
            outputs = model(features, training=False)
            sums = span_sums(outputs, features)
            loss = sums["example_loss"] / sums["examples"]
        results[name] = (outputs, sums, tape.gradient(loss, model.trainable_weights))
    lengths = windows.encoded.lengths
    for key in ("start_logits", "end_logits"):
        mine, theirs = (by_window(rows, results[name][0][key].numpy()) for name, rows in (("packed", packed),
                                                                                           ("alone", alone)))
        assert sorted(mine) == sorted(theirs) == list(range(len(lengths)))
        for window, length in enumerate(lengths):
            np.testing.assert_allclose(mine[window][:length], theirs[window][:length], atol=1e-6)
            assert (mine[window][length:] == OUTSIDE_THE_SEQUENCE).all()  # nothing of another sequence
    for key in ("example_loss", "examples", "example_correct"):
        np.testing.assert_allclose(results["packed"][1][key], results["alone"][1][key], rtol=1e-6)
    for mine, theirs in zip(results["packed"][2], results["alone"][2]):
        np.testing.assert_allclose(tf.convert_to_tensor(mine), tf.convert_to_tensor(theirs), atol=1e-6)
    assert float(results["packed"][1]["examples"]) == len(lengths)
    trained = [v.path for v in model.trainable_weights]  # the encoder and the span head: no pooler, no pre-training head
    assert not any(part in path for path in trained for part in ("masked_lm", "seq_relationship", "pooler"))
    assert any("qa_outputs" in path for path in trained)


def squad_flags(tmp_path, bert_config_file, output_dir, *more):
    return [f"--train_file={tmp_path / 'train.json'}", f"--predict_file={tmp_path / 'dev.json'}",
            f"--vocab_file={VOCAB}", f"--bert_config_file={bert_config_file}", "--max_seq_length=48",
            "--doc_stride=16", "--max_query_length=12", "--train_batch_size=8", "--num_train_epochs=2",
            "--learning_rate=1e-3", "--iterations_per_loop=4", "--max_sequences_per_pack=4",
            f"--output_dir={tmp_path / output_dir}", *more]


def assert_predicted_without_scoring_the_unanswered(tmp_path, bert_config_file, checkpoint, name, keep, answers):
    """dev.json's questions, those not in `keep` without their answers, predicted by `checkpoint`:
    the same `answers`, scores over the answered ones, and no loss (an unanswered window's target
    would be its [CLS])."""
    test = json.loads((tmp_path / "dev.json").read_text())
    for paragraph in test["data"][0]["paragraphs"]:
        for qa in paragraph["qas"]:
            if qa["id"] not in keep:
                del qa["answers"]
    (tmp_path / f"{name}.json").write_text(json.dumps(test))
    predicted = run_command("run_squad", *squad_flags(tmp_path, bert_config_file, name, "--do_predict", checkpoint,
                                                      f"--predict_file={tmp_path / f'{name}.json'}"))
    assert predicted.returncode == 0, predicted.stderr
    assert json.loads((tmp_path / name / "predictions.json").read_text()) == answers
    assert "loss" not in (tmp_path / name / "eval_results.txt").read_text()
    examples = read_squad_examples(str(tmp_path / f"{name}.json"))
    if keep:
        scores = squad_scores([example for example in examples if example.answers], answers)
        figures = f"exact match {scores['exact_match']:.2f}, f1 {scores['f1']:.2f} over the 4 questions with answers ("
    else:
        figures = "not scored (the file has no answers) over "
    assert f"answered 8 questions of {tmp_path / f'{name}.json'}: {figures}" in predicted.stdout, predicted.stdout


@pytest.mark.slow  # fine-tunes packed and evaluates padded (over 3.5 s here)
def test_run_squad_fine_tunes_packed_and_answers_as_the_padded_evaluation_of_its_weights(tmp_path, bert_config_file):
    write_squad(tmp_path / "train.json", 12)
    write_squad(tmp_path / "dev.json", 4)
    pretrained = BertPretrainingModel(BertConfig.from_json_file(bert_config_file))
    weights = export_google_checkpoint(pretrained, str(tmp_path / "pretrained" / "bert_model.ckpt"))
    result = run_command("run_squad", *squad_flags(tmp_path, bert_config_file, "packed", "--do_train", "--do_predict",
                                                   f"--init_checkpoint={weights}",
                                                   f"--export_huggingface_dir={tmp_path / 'hf'}"))
    assert result.returncode == 0, result.stderr
    [(windows, rows)] = re.findall(r"train.json: (\d+) windows in (\d+) rows of 48 tokens", result.stderr)
    assert int(rows) < int(windows)  # packed
    [evaluation] = [json.loads(line) for line in open(tmp_path / "packed" / "eval_log.jsonl", encoding="utf-8")]
    answers = json.loads((tmp_path / "packed" / "predictions.json").read_text())
    assert sorted(answers) == sorted(f"p{p}q{q}" for p in range(4) for q in range(2))
    assert squad_scores(read_squad_examples(str(tmp_path / "dev.json")), answers) == pytest.approx(
        {"exact_match": evaluation["exact_match"], "f1": evaluation["f1"]})
    assert re.search(rf"run_squad: answered 8 questions of {tmp_path / 'dev.json'}: exact match [\d.]+, f1 [\d.]+, "
                     rf"loss [\d.]+ over \d+ windows -> {tmp_path / 'packed' / 'predictions.json'}", result.stdout)
    nbest = json.loads((tmp_path / "packed" / "nbest_predictions.json").read_text())
    assert all(nbest[q][0]["text"] == answers[q] for q in answers)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["BertForQuestionAnswering"]
    # Its weights answer the same, one window a row (google-research's --do_predict on its model.ckpt-N).
    step = evaluation["step"]
    padded = run_command("run_squad", *squad_flags(tmp_path, bert_config_file, "padded", "--do_predict",
                                                   "--input_mode=padded",
                                                   f"--init_checkpoint={tmp_path / 'packed' / f'model.ckpt-{step}'}"))
    assert padded.returncode == 0, padded.stderr
    assert json.loads((tmp_path / "padded" / "predictions.json").read_text()) == answers
    assert f"exact match {evaluation['exact_match']:.2f}, f1 {evaluation['f1']:.2f}" in padded.stdout
    # The same questions without their answers (a test set's): answered the same, not scored; with
    # half of them answered, scored over those.
    checkpoint = f"--init_checkpoint={tmp_path / 'packed' / f'model.ckpt-{step}'}"
    for name, keep in (("test", set()), ("half", {"p0q0", "p1q1", "p2q0", "p3q1"})):
        assert_predicted_without_scoring_the_unanswered(tmp_path, bert_config_file, checkpoint, name, keep, answers)
    # Training is scored by its own answers whatever the predict file holds.
    trained = run_command("run_squad", *squad_flags(tmp_path, bert_config_file, "trained_for_a_test_set", "--do_train",
                                                    "--do_predict", f"--predict_file={tmp_path / 'test.json'}",
                                                    "--num_train_epochs=1"))
    assert trained.returncode == 0, trained.stderr
    [evaluation] = [json.loads(line) for line in open(tmp_path / "trained_for_a_test_set" / "eval_log.jsonl")]
    assert evaluation["questions_scored"] == 0 and "loss" not in evaluation
    trained_log = [json.loads(line) for line in open(tmp_path / "trained_for_a_test_set" / "train_log.jsonl")]
    assert trained_log and all(record["loss"] > 0 for record in trained_log)


@pytest.mark.slow  # loads PyTorch and transformers
def test_transformers_gives_each_window_alone_the_span_logits_it_has_in_a_pack(tokenizer, squad_file, tmp_path):
    """The export is a BertForQuestionAnswering (no pooler, no pre-training head) that transformers
    reads, giving each window alone the start and end logits it has in a pack; it starts a span
    model whole again (--init_checkpoint of a fine-tuned model, to predict with it)."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    from bert_packed.model import export_huggingface
    from bert_packed.training.objective import SpanPrediction

    windows, packed = span_rows(tokenizer, squad_file, depth=4)
    model = BertQuestionAnsweringModel(BertConfig(**TINY))
    outputs = model({k: tf.constant(v) for k, v in packed.items()})
    directory = export_huggingface(model, str(tmp_path / "hf"), VOCAB, do_lower_case=True)
    tensors = load_file(f"{directory}/model.safetensors")
    assert "qa_outputs.weight" in tensors and not any(name.startswith(("cls.", "bert.pooler.")) for name in tensors)
    theirs = transformers.BertForQuestionAnswering.from_pretrained(directory).eval()
    rows, slots = np.nonzero(packed["label_weights"])
    for row, slot in zip(rows, slots):
        tokens = packed["sequence_ids"][row] == slot + 1
        with torch.no_grad():
            answer = theirs(input_ids=torch.tensor(packed["input_ids"][row][tokens][None], dtype=torch.long),
                            token_type_ids=torch.tensor(packed["segment_ids"][row][tokens][None], dtype=torch.long))
        for key in ("start_logits", "end_logits"):
            np.testing.assert_allclose(getattr(answer, key).numpy()[0], outputs[key].numpy()[row, slot, :tokens.sum()],
                                       atol=1e-4, rtol=0)
    again = BertQuestionAnsweringModel(BertConfig(**TINY))
    again.build()
    SpanPrediction(None).load_initial_weights(again, directory)
    for a, b in zip(model.weights, again.weights, strict=True):
        if not any(part in a.path for part in ("masked_lm", "seq_relationship", "pooler")):  # not exported
            np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("flags, message", [
    (["--init_checkpoint=no/such/model.ckpt-3"], "--init_checkpoint=no/such/model.ckpt-3: not there; expected a "
                                                 "checkpoint (model.ckpt-N, bert_model.ckpt) or a Hugging Face directory"),
    (["--packing_algorithm=best"], "flag --packing_algorithm=best: value should be one of <spfhp|lpfhp|nnlshp|lp>"),
    (["--doc_stride=40"], "--doc_stride=40: above the 33 context tokens a window holds (--max_seq_length - "
                          "--max_query_length - 3): windows would skip text"),
    (["--do_train=false"], "at least one of --do_train or --do_predict must be given"),
])
def test_run_squad_refuses_bad_flags_in_one_line_before_anything_is_written(tmp_path, bert_config_file, flags,
                                                                           message):
    write_squad(tmp_path / "train.json", 2)
    write_squad(tmp_path / "dev.json", 1)
    result = run_command("run_squad", *squad_flags(tmp_path, bert_config_file, "run", "--do_train"), *flags)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [f"run_squad: error: {message}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # compiles and trains packed and one-window-a-row steps (over 3.5 s here)
def test_the_compiled_step_trains_packed_windows_as_it_trains_one_window_a_row(tokenizer, squad_file, tmp_path):
    from training_runs import two_fine_tuning_updates

    from bert_packed.training.objective import SpanPrediction

    windows, packed = span_rows(tokenizer, squad_file, depth=4)
    _, alone = span_rows(tokenizer, squad_file, depth=1)
    count = len(windows.encoded.input_ids)
    start, packed_after, packed_sums, step = two_fine_tuning_updates(packed, "packed", count / len(packed["input_ids"]),
                                                                     tmp_path / "packed", SpanPrediction)
    _, alone_after, alone_sums, _ = two_fine_tuning_updates(alone, "padded", 1.0, tmp_path / "padded", SpanPrediction,
                                                            start)
    assert packed_sums["examples"] == alone_sums["examples"] == count
    assert packed_sums["example_loss"] == pytest.approx(alone_sums["example_loss"], rel=1e-5)
    # Two weights' gradients are zero but for rounding: the span bias and the last layer's output
    # LayerNorm beta (the span head reads it linearly) each move every logit of a sequence's softmax
    # alike. AdamW scales that rounding up to a few millionths, which differ between CPUs' kernels
    # (the bias's 1.8e-6 against 0.4e-6 on one; the beta's 2.1e-7 here): each is held to have stayed
    # put, a hundredth of one learning rate's step (1e-3), not to its rounding.
    paths = [weight.path for weight in step.model.weights]
    still = {paths.index(step.model.qa_outputs.bias.path),
             paths.index(step.model.encoder.encoder_layers[-1].output_layer_norm.beta.path)}
    changed = 0
    for index, (before, a, b) in enumerate(zip(start, packed_after, alone_after, strict=True)):
        if index in still:
            np.testing.assert_allclose(a, before, atol=1e-5)  # packed
            np.testing.assert_allclose(b, before, atol=1e-5)  # one window a row
            continue
        np.testing.assert_allclose(a, b, atol=1e-6)
        changed += not np.array_equal(a, before)
    assert changed == len(step.model.trainable_weights) - 2  # the rest of the encoder and the span kernel moved


def test_questions_whose_answers_no_window_holds_are_counted_in_the_log(tokenizer, caplog):
    """Such an answer is trained on as "no answer" in every window (google-research's way): the
    run says how many, instead of nothing."""
    context = "the cat sat on the mat and then the dog ran far away from the house at night"
    long = SquadExample("long", "where ?", context, (("the cat sat on the mat and then the dog ran", 0),), 3)
    short = SquadExample("short", "where ?", context, (("mat", context.index("mat")),), 9)
    with caplog.at_level("WARNING"):
        make_windows([long, short], tokenizer, 12, 4, 8, "train.json")
    assert [r.getMessage() for r in caplog.records] == [
        "train.json: 1 question whose answer is longer than every window: each of its windows says no answer there"]
