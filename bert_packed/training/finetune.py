"""What run_classifier and run_squad build from their settings before any device: the task's
examples read, encoded and placed in rows (packed or one a row), and the run's settings, data and
objective, so that pre-training's loop (loop.train_and_evaluate) fine-tunes.

The run's settings follow google-research/bert's run_classifier and run_squad: AdamW (weight decay 0.01, LayerNorm
and biases excluded), the learning rate warmed up over --warmup_proportion of the updates and then
decayed linearly to 0, the gradient clipped to a global norm of 1, int(examples / batch * epochs)
updates. A packed update holds as many examples on average as a padded one: --train_batch_size
counts examples, and the rows of an update are the packs that hold them (adjust_batch_for_packing),
as pre-training counts its batch in sequences.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING

from bert_packed.console.root_logger import root_logger_kept
from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.finetuning.encode import EncodedExamples, RepackedRows, encode_examples, make_rows
from bert_packed.finetuning.squad import make_windows, read_squad_examples
from bert_packed.finetuning.tasks import get_task, read_examples, task_labels
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.file_identity import FileIdentity
from bert_packed.model import BertConfig
from bert_packed.model.huggingface import is_huggingface_directory, require_export_directory, require_same_model
from bert_packed.packing.assign import assign_to_packs
from bert_packed.pretraining_data.tokenization import Tokenizer
from bert_packed.storage import files
from bert_packed.storage.run_directory import EVAL_LOG, PREDICTIONS, TEST_RESULTS, RunDirectory
from bert_packed.training.config import TrainConfig, make_config
from bert_packed.training.data import EvalData, TrainData
from bert_packed.training.finetune_settings import ClassifierSettings, FineTuningSettings, SquadSettings
from bert_packed.training.launch import cluster_of_this_task, make_strategy
from bert_packed.training.objective import Answering, Classification, SpanPrediction
from bert_packed.training.step_pool import StepPool, pool_or_own

if TYPE_CHECKING:  # the loop and the compiled step import TensorFlow: imported when a run starts
    from bert_packed.training.loop import RunResult


@dataclasses.dataclass(frozen=True)
class FineTuning:
    """A fine-tuning run as the loop takes it.

    Attributes:
      config: the run's settings.
      train_data: the training examples' rows (no files: evaluation only).
      eval_data: the dev examples' rows (no files: no evaluation).
      objective: the task's head (objective.Classification or SpanPrediction).
      test_data: a classifier's test examples' rows (--do_predict; no files: none).
    """

    config: TrainConfig
    train_data: TrainData
    eval_data: EvalData
    objective: Classification | SpanPrediction
    test_data: EvalData = dataclasses.field(default_factory=EvalData)


@dataclasses.dataclass(frozen=True)
class FineTuningResult:
    """What a fine-tuning command made.

    Attributes:
      directory: the run's directory (its checkpoints, logs and results).
      run: how training ended (loop.RunResult: its last step, or the signal that stopped it after
        a save); None when the command did not train.
      evaluation: the last evaluation's record (step, the task's figures, loss; {} when none).
      figures: that evaluation in words ("accuracy 0.8603, f1 0.9010, loss 0.3512 over 408
        examples"), "" when none.
      at_chance: the warning that the run learned nothing (curves.at_chance_warning), else None.
      predictions: --do_predict's file (run_squad's predictions.json, run_classifier's
        test_results.tsv), None when none was written.
      num_predictions: the questions it answers, the test examples it scores.
    """

    directory: RunDirectory
    run: RunResult | None
    evaluation: dict
    figures: str
    at_chance: str | None
    predictions: str | None = None
    num_predictions: int = 0


@root_logger_kept()
def run_classifier(settings: ClassifierSettings, step_pool: StepPool | None = None,
                   flags_text: str = "") -> FineTuningResult:
    """run_classifier.py as a function: fine-tunes (--do_train), evaluates (--do_eval) and
    predicts the test file (--do_predict: test_results.tsv) as google-research's run_classifier
    does, on packed or padded rows.

        settings = ClassifierSettings(task_name="jsonl", data_dir="my_task", bert_config_file=...,
                                      init_checkpoint=..., output_dir="runs/my_task", do_train=True,
                                      do_eval=True, precision="bf16")
        result = run_classifier(settings)
        result.evaluation["accuracy"]

    Args:
      settings: the command's settings (as its flags give them).
      step_pool: compiled steps kept for reuse across runs (a StepPool; None: this call's own).
      flags_text: the command line as a flagfile, recorded in the run's flags.txt.

    Returns:
      What it made (FineTuningResult).

    Raises:
      UserError: a setting, a file or a record that cannot make the run, in one line.
    """
    step_pool = pool_or_own(step_pool)
    cluster = cluster_of_this_task(settings)  # first: under Slurm it picks this task's GPUs
    return _fine_tune(classifier_run(settings, flags_text), settings, cluster, step_pool, settings.do_eval)


@root_logger_kept()
def run_squad(settings: SquadSettings, step_pool: StepPool | None = None, flags_text: str = "") -> FineTuningResult:
    """run_squad.py as a function: fine-tunes on --train_file (--do_train) and answers
    --predict_file (--do_predict: predictions.json and nbest_predictions.json in the run's
    directory, scored where the file holds answers).

    Args, Returns, Raises: as run_classifier's.
    """
    step_pool = pool_or_own(step_pool)
    cluster = cluster_of_this_task(settings)
    return _fine_tune(squad_run(settings, flags_text), settings, cluster, step_pool, settings.do_predict)


def _fine_tune(fine_tuning: FineTuning, settings: FineTuningSettings, cluster, step_pool: StepPool,
               evaluates: bool) -> FineTuningResult:
    """Trains (when settings.do_train), evaluates and predicts the run `fine_tuning` under the
    strategy the settings ask for, on a step of `step_pool`."""
    from bert_packed.reports.curves import at_chance_warning
    from bert_packed.training.distribution import leave_together
    from bert_packed.training.loop import evaluate_only, train_and_evaluate
    from bert_packed.training.process import run_set_up

    config, objective = fine_tuning.config, fine_tuning.objective
    directory = RunDirectory(config.run.output_dir)
    with run_set_up(config), step_pool.holding(config, fine_tuning.train_data,
                                                           make_strategy(settings, cluster), objective) as step:
        run, record = None, {}
        if settings.do_train:
            run = train_and_evaluate(config, fine_tuning.train_data, fine_tuning.eval_data, step)
            leave_together(step.strategy)  # the chief last: its process holds the workers' coordination service
            directory = run.directory
            if run.stopped_by:
                return FineTuningResult(directory, run, {}, "", None)
            record = (directory.read_log(EVAL_LOG)[-1:] or [{}])[0] if evaluates else {}
        answers_missing = isinstance(objective, SpanPrediction) and objective.answers is None
        if evaluates and (not settings.do_train or answers_missing):  # a run resumed finished answers again
            record = evaluate_only(config, fine_tuning.eval_data, step)
        predictions, predicted = _predictions(fine_tuning, settings, step, directory)
    warning = at_chance_warning(directory) if settings.do_train and record else None
    figures = objective.describe(record) if record else ""
    return FineTuningResult(directory, run, record, figures, warning, predictions, predicted)


def _predictions(fine_tuning: FineTuning, settings: FineTuningSettings, step, directory: RunDirectory
                 ) -> tuple[str | None, int]:
    """--do_predict's file, written by the chief, and how many it answers: a span objective's
    answers of its evaluation (predictions.json), or a classifier's test examples each scored by
    the newest checkpoint (test_results.tsv); (None, 0) without --do_predict."""
    from bert_packed.training.distribution import chief
    from bert_packed.training.loop import predict_only

    objective, is_chief = fine_tuning.objective, chief(step.strategy)[0]
    if isinstance(objective, SpanPrediction) and objective.answers is not None:
        if is_chief:
            directory.write_predictions(*objective.answers)
        return directory.file(PREDICTIONS), len(objective.answers[0])
    if not fine_tuning.test_data.files:
        return None, 0
    config = fine_tuning.config
    predicting = dataclasses.replace(config, eval=dataclasses.replace(
        config.eval, eval_batch_size=settings.predict_batch_size))
    _, outputs = predict_only(predicting, fine_tuning.test_data, step)
    results = objective.test_results(outputs)
    if is_chief:
        directory.write_test_results(results)
    return directory.file(TEST_RESULTS), len(results)


def classifier_run(settings: ClassifierSettings, flags_text: str = "") -> FineTuning:
    """Reads and packs the task's files and makes the run's settings (module docstring).

    Raises:
      SettingsError / TaskDataError / VocabularyError: naming the flag, or the file and line.
    """
    task = get_task(settings.task_name)
    bert, tokenizer = _model_and_vocabulary(settings)
    train_path = os.path.join(settings.data_dir, task.train_file)
    # A "jsonl" task's classes are its training file's labels, even to evaluate: where that file is
    # gone, those the run recorded.
    recorded = RunDirectory(settings.output_dir).read_info().get("labels") if settings.output_dir else None
    if not settings.do_train and not task.labels and not files.exists(train_path) and recorded:
        train_examples, labels = [], tuple(recorded)
    else:
        if not task.labels and not files.exists(train_path):
            raise SettingsError(f"{train_path}: not there; a jsonl task's classes are its training file's labels "
                                f"(or those of a run of it in --output_dir)")
        train_examples = read_examples(task, train_path) if settings.do_train or not task.labels else []
        labels = task_labels(task, train_examples, train_path)
    train_data = _no_training(settings)
    if settings.do_train:
        encoded = encode_examples(train_examples, task, labels, tokenizer, settings.max_seq_length)
        train_data = _rows_data(TrainData, encoded, train_path, settings)
    eval_data = EvalData()
    if settings.do_eval:
        dev_path = os.path.join(settings.data_dir, task.dev_file)
        encoded = encode_examples(read_examples(task, dev_path, labels), task, labels, tokenizer,
                                  settings.max_seq_length)
        eval_data = _rows_data(EvalData, encoded, dev_path, settings)
    test_data = EvalData()
    if settings.do_predict:
        test_path = os.path.join(settings.data_dir, task.test_file)
        encoded = encode_examples(read_examples(task, test_path, labels, test=True), task, labels, tokenizer,
                                  settings.max_seq_length)
        test_data = _rows_data(EvalData, encoded, test_path, settings)
    config = _config(settings, bert, len(train_examples), train_data, settings.eval_batch_size, flags_text)
    identity = {**_identity(settings, tokenizer), "task_name": task.name, "labels": list(labels)}
    return FineTuning(config, train_data, eval_data, Classification(config, labels, task.metrics, identity), test_data)


def squad_run(settings: SquadSettings, flags_text: str = "") -> FineTuning:
    """Reads the SQuAD files, cuts their questions into windows, packs them and makes the run's
    settings (module docstring). An epoch counts questions, as google-research's does: a
    question's windows are its example.

    Raises:
      SettingsError / TaskDataError / VocabularyError: naming the flag, or the file and line.
    """
    bert, tokenizer = _model_and_vocabulary(settings)
    train_data, num_questions = _no_training(settings), 0
    if settings.do_train:
        examples = read_squad_examples(settings.train_file, training=True)
        windows = make_windows(examples, tokenizer, settings.max_seq_length, settings.doc_stride,
                               settings.max_query_length, settings.train_file)
        train_data = _rows_data(TrainData, windows.encoded, settings.train_file, settings, "windows")
        num_questions = len(examples)
    eval_data, answering = EvalData(), None
    if settings.do_predict:
        examples = read_squad_examples(settings.predict_file)
        windows = make_windows(examples, tokenizer, settings.max_seq_length, settings.doc_stride,
                               settings.max_query_length, settings.predict_file)
        eval_data = _rows_data(EvalData, windows.encoded, settings.predict_file, settings, "windows")
        answering = Answering(examples, windows, settings.n_best_size, settings.max_answer_length)
    config = _config(settings, bert, num_questions, train_data, settings.predict_batch_size, flags_text)
    identity = {**_identity(settings, tokenizer), "doc_stride": settings.doc_stride,
                "max_query_length": settings.max_query_length}
    return FineTuning(config, train_data, eval_data, SpanPrediction(config, answering, identity))


def _model_and_vocabulary(settings: FineTuningSettings) -> tuple[BertConfig, Tokenizer]:
    """The BERT config and the tokenizer, refused where they cannot make the run."""
    bert = BertConfig.from_json_file(settings.bert_config_file)
    if settings.max_seq_length > bert.max_position_embeddings:
        raise SettingsError(f"--max_seq_length={settings.max_seq_length}: above the BERT config's "
                            f"max_position_embeddings={bert.max_position_embeddings}")
    init = settings.init_checkpoint
    if init and not any(files.exists(path) for path in (init, f"{init}.index")):
        raise SettingsError(f"--init_checkpoint={init}: not there; expected a checkpoint (model.ckpt-N, "
                            f"bert_model.ckpt) or a Hugging Face directory")
    if init and is_huggingface_directory(init):
        require_same_model(init, bert)
    if settings.export_huggingface_dir:
        require_export_directory(settings.export_huggingface_dir, settings.vocab_file, settings.do_lower_case, bert,
                                 settings.output_dir)
    tokenizer = Tokenizer(settings.vocab_file, settings.do_lower_case)
    if tokenizer.vocab_size > bert.vocab_size:
        raise SettingsError(f"--vocab_file={settings.vocab_file}: {tokenizer.vocab_size:,} tokens, but the BERT config "
                            f"has vocab_size={bert.vocab_size:,}: not the vocabulary of this model")
    return bert, tokenizer


def _no_training(settings: FineTuningSettings) -> TrainData:
    """The training data of a run that only evaluates: its rows' shapes, no rows."""
    return TrainData(shapes=Shapes(settings.max_seq_length, 0, _depth(settings)),
                     input_mode=settings.input_mode)


def _depth(settings: FineTuningSettings) -> int:
    return 1 if settings.input_mode == "padded" else settings.max_sequences_per_pack


def _config(settings: FineTuningSettings, bert: BertConfig, num_examples: int, train_data: TrainData,
            eval_batch_size: int, flags_text: str) -> TrainConfig:
    """The run's settings (module docstring) for `num_examples` training examples."""
    steps = _updates(settings, num_examples, train_data.packing_factor) if settings.do_train else 1
    # Evaluations and progress lines come between compiled loops: a loop of 1,000 updates would
    # evaluate a run of --eval_every_samples=1500 once, at its end. So a loop ends at each evaluation.
    loop = settings.iterations_per_loop
    if settings.eval_every_samples:
        loop = min(loop, max(1, settings.eval_every_samples // settings.train_batch_size))
    return make_config(
        bert=bert, precision=settings.precision, xla=settings.xla, recompute=settings.recompute,
        init_checkpoint=settings.init_checkpoint, output_dir=settings.output_dir,
        input_mode=settings.input_mode, train_batch_size=settings.train_batch_size,
        adjust_batch_for_packing=settings.input_mode != "padded", optimizer="adamw",
        # google-research's clip: the whole update's gradient, the mean over all its examples (on
        # several replicas, not the mean of each replica's own mean, which packs of unequal
        # counts would weigh otherwise).
        clip_by_global_norm_after_gradient_allreduce=True,
        learning_rate=settings.learning_rate, num_train_steps=steps,
        num_warmup_steps=int(steps * settings.warmup_proportion), eval_batch_size=eval_batch_size,
        eval_every_samples=settings.eval_every_samples, seed=settings.seed, deterministic=True,
        save_checkpoints_steps=settings.save_checkpoints_steps, iterations_per_loop=loop,
        log_every_steps=max(1, min(100, steps // 10)), export_huggingface_dir=settings.export_huggingface_dir,
        vocab_file=settings.vocab_file, do_lower_case=settings.do_lower_case, flags_text=flags_text)


def _identity(settings: FineTuningSettings, tokenizer: Tokenizer) -> dict:
    """What makes the rows and the schedule, beside the settings run.json records: another value
    is another run, refused in its --output_dir."""
    return {**{name: getattr(settings, name) for name in (
        "num_train_epochs", "warmup_proportion", "do_lower_case", "max_seq_length", "max_sequences_per_pack",
        "packing_algorithm")}, "vocab_size": tokenizer.vocab_size}


def _updates(settings: FineTuningSettings, num_examples: int, packing_factor: float) -> int:
    """The updates of --num_train_epochs: google-research's int(examples / batch * epochs) one
    example a row; packed, whole epochs of the rows in the packs an update holds (the batch
    correction rounds to whole packs: round(batch / packing factor))."""
    rows = max(1, round(settings.train_batch_size / packing_factor))
    steps = int(num_examples / (rows * packing_factor) * settings.num_train_epochs)
    if steps < 1:
        raise SettingsError(f"--num_train_epochs={settings.num_train_epochs} of {num_examples} examples in batches of "
                            f"{settings.train_batch_size} is no update; train longer or on smaller batches")
    return steps


def _rows_data(kind: type, encoded: EncodedExamples, path: str, settings: FineTuningSettings,
               noun: str = "examples"):
    """TrainData or EvalData of a file's sequences (`noun` in the log), in rows as --input_mode says."""
    depth = _depth(settings)
    assignment = assign_to_packs(encoded.lengths, settings.max_seq_length, depth, settings.packing_algorithm,
                                 settings.seed)
    if kind is TrainData and settings.input_mode == "packed_online":  # the same plan, packed anew each epoch
        rows = RepackedRows(encoded, assignment.plan, settings.max_seq_length, depth, settings.seed)
    else:
        rows = make_rows(encoded, assignment, settings.max_seq_length, depth)
    count = len(encoded.input_ids)
    logging.info("%s: %d %s in %d %s of %d tokens (%.2f %s a row, %.1f%% of the tokens real)", path, count, noun,
                 assignment.num_packs, "row" if assignment.num_packs == 1 else "rows", settings.max_seq_length,
                 count / assignment.num_packs, noun,
                 100 * encoded.lengths.sum() / (assignment.num_packs * settings.max_seq_length))
    facts = dict(inputs=Dataset((path,), (FileIdentity.of(path, whole=True),)),
                 shapes=Shapes(settings.max_seq_length, 0, depth), input_mode=settings.input_mode, num_sequences=count,
                 rows=rows)
    if kind is TrainData:
        facts["packing_factor"] = count / assignment.num_packs
    return kind(**facts)
