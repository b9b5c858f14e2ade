"""The training loop: accumulation, distribution, resume, NaN, evaluation and logs."""

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, REPO, TINY, VOCAB, command_in_this_process, run_command, tfrecords
from training_runs import (
    assert_same_evaluation,
    config,
    give_back,
    make_trainer,
    read_log,
    sigterm_in_the_loop_from,
    trained,
    weights,
)

from bert_packed.errors import InputFilesError, InternalError, SettingsError, TrainingError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset_info import read_dataset_info
from bert_packed.inputs.file_identity import DataChangedError, FileIdentity
from bert_packed.model import BertConfig
from bert_packed.training.data import eval_pipeline
from bert_packed.training.step import CompiledStep


@pytest.mark.slow  # trains four runs: micro-steps and one big batch, for each loss averaging (over 3.5 s here)
def test_accumulated_micro_batches_equal_one_big_batch(packed_dir, tmp_path):
    files = tfrecords(packed_dir)
    for averaging in ("token", "sequence"):
        # Two micro-steps make one update; the clip of the whole update keeps it one big batch.
        accumulated = make_trainer(config(tmp_path / f"a-{averaging}", files, dropout=0.0, steps_per_update=2,
                                          num_train_steps=2, loss_averaging=averaging,
                                          clip_by_global_norm_after_gradient_allreduce=True))
        start = weights(accumulated)
        accumulated.train()
        big = make_trainer(config(tmp_path / f"b-{averaging}", files, dropout=0.0, train_batch_size=8, num_train_steps=1,
                             loss_averaging=averaging, clip_by_global_norm_after_gradient_allreduce=True))
        for w, value in zip(big.model.weights, start):
            w.assign(value)
        big.train()
        for a, b, _before in zip(weights(accumulated), weights(big), start):
            np.testing.assert_allclose(a, b, atol=2e-6)
        assert any(not np.allclose(a, s) for a, s in zip(weights(big), start))
        first = read_log(os.path.join(tmp_path, f"a-{averaging}", "train_log.jsonl"))[0]
        second = read_log(os.path.join(tmp_path, f"b-{averaging}", "train_log.jsonl"))[0]
        assert first["loss"] == pytest.approx(second["loss"], rel=1e-6)
        assert first["sequences"] == second["sequences"] > 8  # packs of several sequences


MIRRORED = r"""
import sys, numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, sys.argv[3])
from training_runs import config, make_trainer, weights
files = sys.argv[2].split(",")
single = make_trainer(config(sys.argv[1] + "/single", files, dropout=0.0, train_batch_size=8, num_train_steps=1,
                        clip_by_global_norm_after_gradient_allreduce=True))
start = weights(single)
single.train()
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
mirrored = make_trainer(config(sys.argv[1] + "/mirrored", files, dropout=0.0, train_batch_size=8, num_train_steps=1,
                          clip_by_global_norm_after_gradient_allreduce=True), strategy)
assert mirrored.strategy.num_replicas_in_sync == 2
for w, value in zip(mirrored.model.weights, start):
    w.assign(value)
mirrored.train()
from bert_packed.errors import SettingsError
try:
    make_trainer(config(sys.argv[1] + "/odd", files, train_batch_size=3), strategy)
    raise AssertionError("3 rows on 2 replicas were taken")
except SettingsError as e:
    assert str(e) == "--train_batch_size=3 rows do not divide among the 2 replicas: use a multiple of 2", e
try:  # the eval batch too, before any training (it crashed in tf.distribute at the first evaluation)
    make_trainer(config(sys.argv[1] + "/odd_eval", files, eval_files=files, eval_packed=True, eval_batch_size=3),
                 strategy).train()
    raise AssertionError("an eval batch of 3 rows on 2 replicas was taken")
except SettingsError as e:
    assert str(e) == "--eval_batch_size=3 rows do not divide among the 2 replicas: use a multiple of 2", e
import os
assert not os.path.exists(sys.argv[1] + "/odd_eval/train_log.jsonl")
# Every eval sequence once, packed on the fly too (its batches' static shape left the last share
# out: 121 of 122), and --max_eval_steps in whole batches of 8, not one replica's share of 4.
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH
from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.training.data import eval_data, eval_pipeline
for mode, steps, counted in (("packed_online", {}, 122), (None, {"max_eval_steps": 1}, 8)):
    settings = config(sys.argv[1] + f"/eval_{mode}", files, eval_input_mode=mode, **steps).config
    evaluation = eval_data(Dataset.described(sys.argv[4].split(","), "--eval_files"),
                           Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, 3), settings)
    assert mirrored.compiled.evaluate(eval_pipeline(evaluation, settings))["num_sequences"] == counted
print(max(float(np.abs(a - b).max()) for a, b in zip(weights(single), weights(mirrored))))
"""


@pytest.mark.slow
def test_mirrored_over_two_devices_gives_the_same_update(packed_dir, unpacked_dir, tmp_path):
    result = subprocess.run([sys.executable, "-c", MIRRORED, str(tmp_path), ",".join(tfrecords(packed_dir)),
                             os.path.dirname(__file__), ",".join(tfrecords(unpacked_dir))],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.strip().splitlines()[-1]) < 2e-6


@pytest.mark.slow  # trains a run, stops it and resumes it (over 3.5 s here)
def test_an_interrupted_run_resumes_with_exactly_the_same_losses(packed_dir, tmp_path):
    files = tfrecords(packed_dir)
    trained(config(tmp_path / "straight", files, num_train_steps=4))
    interrupted = make_trainer(config(tmp_path / "resumed", files, num_train_steps=4))
    sigterm_in_the_loop_from(interrupted, 1)  # during step 2
    interrupted.train()
    give_back(interrupted)
    assert [r["step"] for r in read_log(tmp_path / "resumed" / "train_log.jsonl")] == [1, 2]
    trained(config(tmp_path / "resumed", files, num_train_steps=4))
    straight = read_log(tmp_path / "straight" / "train_log.jsonl")
    resumed = read_log(tmp_path / "resumed" / "train_log.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]
    assert [r["sequences"] for r in resumed] == [r["sequences"] for r in straight]


def test_a_signal_before_the_first_step_saves_nothing_and_the_same_command_starts_the_run(packed_dir, tmp_path):
    """Step 0 is where a run starts, not a checkpoint: a signal while the first loop compiles
    stopped the run at step 0 and saved it, and the same command then found that checkpoint and
    no run to resume."""
    files = tfrecords(packed_dir)
    stopped = make_trainer(config(tmp_path, files, num_train_steps=2))
    loop = stopped.update.loop

    def sigterm_then_loop(iterator, num_updates):
        os.kill(os.getpid(), signal.SIGTERM)
        return loop(iterator, num_updates)

    stopped.update.loop = sigterm_then_loop
    stopped.train()
    assert (stopped.stopped_by, int(stopped.step)) == ("SIGTERM", 0)
    give_back(stopped)
    assert not (tmp_path / "checkpoints").exists() or not os.listdir(tmp_path / "checkpoints")
    trained(config(tmp_path, files, num_train_steps=2))
    assert [r["step"] for r in read_log(tmp_path / "train_log.jsonl")] == [1, 2]


@pytest.mark.slow  # trains runs with and without recompute, stops one and resumes it (over 3.5 s here)
def test_recompute_trains_the_same_run_and_a_run_stopped_with_it_resumes_exactly(packed_dir, tmp_path):
    """Recompute changes memory, not the run: with dropout on, a run stopped during step 2 with
    --recompute=attention and resumed with --recompute=layer (a setting a resumed run may change)
    logs the losses of the run without recompute (its backward passes redraw the same masks)."""
    files = tfrecords(packed_dir)
    trained(config(tmp_path / "straight", files, num_train_steps=4))
    interrupted = make_trainer(config(tmp_path / "resumed", files, num_train_steps=4, recompute="attention"))
    sigterm_in_the_loop_from(interrupted, 1)
    interrupted.train()
    assert [r["step"] for r in read_log(tmp_path / "resumed" / "train_log.jsonl")] == [1, 2]
    trained(config(tmp_path / "resumed", files, num_train_steps=4, recompute="layer"))
    straight = read_log(tmp_path / "straight" / "train_log.jsonl")
    resumed = read_log(tmp_path / "resumed" / "train_log.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [r["sequences"] for r in resumed] == [r["sequences"] for r in straight]
    np.testing.assert_allclose([r["loss"] for r in resumed], [r["loss"] for r in straight], rtol=1e-6)


def test_a_crash_after_the_checkpoint_resumes_without_repeated_log_lines(packed_dir, tmp_path):
    files = tfrecords(packed_dir)
    trained(config(tmp_path / "straight", files, num_train_steps=4))
    crashing = make_trainer(config(tmp_path / "resumed", files, num_train_steps=4, save_checkpoints_steps=2))
    update = crashing.update.loop

    def update_then_crash(iterator, num_updates):
        if int(crashing.step) == 3:  # step 3 is logged, the checkpoint is step 2
            raise RuntimeError("killed")
        return update(iterator, num_updates)

    crashing.update.loop = update_then_crash
    with pytest.raises(RuntimeError, match="killed"):
        crashing.train()
    give_back(crashing)
    assert [r["step"] for r in read_log(tmp_path / "resumed" / "train_log.jsonl")] == [1, 2, 3]
    trained(config(tmp_path / "resumed", files, num_train_steps=4, save_checkpoints_steps=2))
    resumed = read_log(tmp_path / "resumed" / "train_log.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in read_log(tmp_path / "straight" / "train_log.jsonl")]
    assert np.all(np.diff([r["seconds"] for r in resumed]) > 0)  # the clock continues from the checkpoint
    assert np.all(np.diff([r["train_seconds"] for r in resumed]) > 0)


def test_a_training_file_changed_under_a_run_stops_it_before_its_next_checkpoint(packed_dir, tmp_path):
    """tf.data opens each file again every epoch, unwatched: every checkpoint is saved only while the
    files are what the run started with, so none holds what was read from new content."""
    data_dir = tmp_path / "data"
    shutil.copytree(packed_dir, data_dir)
    files = tfrecords(str(data_dir))
    identity = tuple(FileIdentity.of(path) for path in files)

    def run():
        return make_trainer(config(tmp_path / "run", files, num_train_steps=4, save_checkpoints_steps=2,
                                   identity=identity))

    trainer = run()
    update = trainer.update.loop
    original = open(files[-1], "rb").read()

    def update_then_regenerate(iterator, num_updates):
        if int(trainer.step) == 2:  # checkpoint 2 is saved: the data is made again in place, records as good
            with open(files[-1], "wb") as f:
                f.write(open(files[0], "rb").read())
        return update(iterator, num_updates)

    trainer.update.loop = update_then_regenerate
    with pytest.raises(DataChangedError, match=rf"^{files[-1]}: changed since the run started \(.*\); the run "
                                               rf"stopped, and no checkpoint holds what was read from the new content"):
        trainer.train()
    assert trainer.checkpoints.latest.endswith("ckpt-2")
    with open(files[-1], "wb") as f:  # restored: the same command goes on from step 2
        f.write(original)
    run().train()
    assert [r["step"] for r in read_log(tmp_path / "run" / "train_log.jsonl")] == [1, 2, 3, 4]


def test_a_nan_loss_stops_and_keeps_the_last_good_checkpoint(packed_dir, tmp_path):
    trainer = make_trainer(config(tmp_path, tfrecords(packed_dir), num_train_steps=4, save_checkpoints_steps=1))
    update = trainer.update.loop

    def poison_after_step_1(iterator, num_updates):
        if int(trainer.step) == 1:
            trainer.model.encoder.embeddings.word_embeddings.assign(np.full(trainer.model.encoder.embeddings.word_embeddings.shape,
                                                                    np.nan, np.float32))
        return update(iterator, num_updates)

    trainer.update.loop = poison_after_step_1
    with pytest.raises(TrainingError, match=r"loss is nan at step 2; stopped without saving, the last good "
                                            r"checkpoint is .*ckpt-1"):
        trainer.train()
    assert trainer.checkpoints.latest.endswith("ckpt-1")


def test_packed_and_unpacked_eval_files_give_the_same_metrics(packed_dir, unpacked_dir, tmp_path):
    packed = make_trainer(config(tmp_path / "p", tfrecords(packed_dir), eval_files=tuple(tfrecords(packed_dir)),
                            eval_packed=True))
    unpacked = make_trainer(config(tmp_path / "u", tfrecords(packed_dir), eval_files=tuple(tfrecords(unpacked_dir))))
    assert_same_evaluation(packed, unpacked, num_sequences=122)
    # 122 sequences in batches of 8 end with a short batch: it calls the trace of the others. On a
    # step of its own (a shared one may come traced for other eval sets), which only evaluates.
    setup = config(tmp_path / "f", tfrecords(packed_dir), eval_files=tuple(tfrecords(unpacked_dir)))
    fresh = CompiledStep(setup.config, setup.train_data)
    assert fresh.evaluate(eval_pipeline(setup.eval_data, setup.config))["num_sequences"] == 122
    assert fresh._evaluate_batch.experimental_get_tracing_count() == 1


def test_an_evaluation_that_does_not_count_every_eval_sequence_once_is_not_logged(packed_dir, unpacked_dir,
                                                                                   tmp_path):
    setup = config(tmp_path, tfrecords(packed_dir), num_train_steps=5, eval_files=tuple(tfrecords(unpacked_dir)),
                   eval_every_samples=1, target_mlm_accuracy=0.0)
    miscounted = dataclasses.replace(setup, eval_data=dataclasses.replace(setup.eval_data, num_sequences=121))
    with pytest.raises(InternalError, match=r"^the evaluation counted 122 sequences, but the eval files hold 121 "
                                            r"\(their metadata.json\): each must count once; nothing of it was logged"):
        trained(miscounted)
    assert read_log(tmp_path / "eval_log.jsonl") == [] and "eval_accuracy" not in open(tmp_path / "mllog.txt").read()
    counted = dataclasses.replace(setup, eval_data=dataclasses.replace(setup.eval_data, num_sequences=122))
    trained(counted)
    assert [r["num_sequences"] for r in read_log(tmp_path / "eval_log.jsonl")] == [122]


def test_reaching_the_target_stops_the_run_and_logs_it(packed_dir, unpacked_dir, tmp_path):
    trainer = make_trainer(config(tmp_path, tfrecords(packed_dir), num_train_steps=5, eval_files=tuple(tfrecords(unpacked_dir)),
                             eval_every_samples=1, target_mlm_accuracy=0.0))
    trainer.train()
    train_log = read_log(tmp_path / "train_log.jsonl")
    eval_log = read_log(tmp_path / "eval_log.jsonl")
    assert len(train_log) == 1 and len(eval_log) == 1
    for key in ("step", "sequences", "loss", "mlm_accuracy", "learning_rate", "seconds", "train_seconds",
                "padding_efficiency"):
        assert key in train_log[0]
    assert eval_log[0]["sequences"] == train_log[0]["sequences"] and eval_log[0]["num_sequences"] == 122
    mllog = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(tmp_path / "mllog.txt")]
    keys = [entry["key"] for entry in mllog]
    assert keys[:2] == ["cache_clear", "init_start"] and keys.index("init_stop") < keys.index("run_start")
    assert "eval_accuracy" in keys and keys[-1] == "run_stop"
    assert mllog[-1]["metadata"]["status"] == "success"
    import tensorflow as tf

    events = [event for path in (tmp_path / "tensorboard").iterdir()
              for event in tf.compat.v1.train.summary_iterator(str(path))]
    steps = {value.tag: event.step for event in events for value in event.summary.value}
    assert steps["train/loss"] == train_log[0]["step"]
    assert steps["train_by_sequences/loss"] == steps["eval_by_sequences/mlm_accuracy"] == train_log[0]["sequences"]
    # What the progress line says, against steps and sequences too.
    values = {value.tag: float(tf.make_ndarray(value.tensor)) for event in events for value in event.summary.value}
    record = train_log[0]
    assert values["train/gradient_norm"] == pytest.approx(record["gradient_norm"]) and record["gradient_norm"] > 0
    assert values["train/padding_efficiency"] == pytest.approx(record["padding_efficiency"])
    assert values["train/sequences_per_second"] == pytest.approx(record["sequences"] / record["train_seconds"])
    assert values["train_by_sequences/real_tokens_per_second"] == pytest.approx(
        record["real_tokens"] / record["train_seconds"])


def run_cli(*args):
    """run_pretraining.py in a subprocess: the command's smoke test."""
    return subprocess.run([sys.executable, os.path.join(REPO, "run_pretraining.py"), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.slow
def test_cli_trains_logs_and_records_its_flags(packed_dir, other_text_dir, bert_config_file, tmp_path):
    out = tmp_path / "run"
    result = run_cli(f"--bert_config_file={bert_config_file}", f"--input_files={packed_dir}/packed-*.tfrecord",
                     f"--eval_files={other_text_dir}/part-*.tfrecord", f"--output_dir={out}", "--max_seq_length=128",
                     "--max_predictions_per_seq=20", "--max_sequences_per_pack=3", "--train_batch_size=4",
                     "--num_train_steps=2", "--eval_every_samples=0", "--adjust_betas_for_packing")
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"flags.txt", "train_log.jsonl", "eval_log.jsonl", "mllog.txt", "checkpoints", "tensorboard"} <= set(
        os.listdir(out))
    assert "--adjust_betas_for_packing" in (out / "flags.txt").read_text()
    packing_factor = read_dataset_info(packed_dir).packing_factor
    betas = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(out / "mllog.txt") if "opt_lamb_beta" in line]
    assert betas[0]["value"] == pytest.approx(0.9 ** packing_factor)
    assert betas[1]["value"] == pytest.approx(0.999 ** packing_factor)
    assert len(read_log(out / "eval_log.jsonl")) == 1


def test_batch_correction_divides_by_the_packing_factor_in_whole_replicas():
    from bert_packed.training.batching import batching
    from bert_packed.training.config import make_config

    def corrected_batch_size(rows, packing_factor, num_replicas=1):
        settings = make_config(bert=BertConfig(**TINY), output_dir="x", train_batch_size=rows,
                               adjust_batch_for_packing=True)
        return batching(settings, "packed", packing_factor, 3, num_replicas).rows_per_micro_batch

    assert corrected_batch_size(8, 1.203) == 7  # 8.4 sequences a micro-batch on average
    assert corrected_batch_size(448, 2.012, num_replicas=8) == 224  # 222.7 packs, in multiples of 8
    assert corrected_batch_size(3, 2.0, num_replicas=4) == 4  # never below one pack a replica


def test_bucket_boundaries_are_for_the_bucketed_mode_whatever_the_mode_comes_from():
    from bert_packed.errors import SettingsError
    from bert_packed.training.batching import batching
    from bert_packed.training.config import make_config

    for given in (None, "packed"):  # None: the data's metadata.json says packed
        settings = make_config(bert=BertConfig(**TINY), output_dir="x", input_mode=given, bucket_boundaries=(64,))
        with pytest.raises(SettingsError, match="--bucket_boundaries is for --input_mode=bucketed"):
            batching(settings, "packed", 1.2, 3)
    settings = make_config(bert=BertConfig(**TINY), output_dir="x", input_mode="bucketed", bucket_boundaries=(64,))
    assert batching(settings, "bucketed", 1.0, 1).rows_per_micro_batch == 8


def test_the_online_packing_window_is_bounded_for_training_and_evaluation():
    from bert_packed.errors import SettingsError
    from bert_packed.training import data
    from bert_packed.training.batching import batching
    from bert_packed.training.config import make_config

    bert, shapes = BertConfig(**TINY), Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, 3)

    def train(window):
        settings = make_config(bert=bert, output_dir="x", online_packing_window=window)
        return batching(settings, "packed_online", 1.0, 3)

    def evaluate(window):
        settings = make_config(bert=bert, output_dir="x", eval_input_mode="packed_online", online_packing_window=window)
        return data.eval_data(data.NO_INPUTS, shapes, settings)

    assert train(3).rows_per_micro_batch == 8
    for window, part in ((99_999_999_999, train), (2, train), (1_000_001, evaluate)):
        with pytest.raises(SettingsError, match=rf"--online_packing_window={window}: at least "
                                                rf"--max_sequences_per_pack=3 and at most 1,000,000 sequences"):
            part(window)


def test_a_run_is_assembled_from_its_flags_by_name_as_the_command_does(packed_dir, bert_config_file, tmp_path):
    """training.assemble takes the flags by name (no absl): what a test or a benchmark gives is
    checked and described as run_pretraining's flags are."""
    from bert_packed.training.assemble import PretrainingSettings, assemble

    def line(**given):
        return PretrainingSettings.of(bert_config_file=bert_config_file, input_files=f"{packed_dir}/packed-*.tfrecord",
                              output_dir=str(tmp_path), max_seq_length=MAX_SEQ_LENGTH,
                              max_predictions_per_seq=MAX_PREDICTIONS, **given)

    config, train_data, eval_data = assemble(line(train_batch_size=4))
    assert (config.batch.train_batch_size, train_data.input_mode, train_data.shapes) == (
        4, "packed", Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, 3))
    assert eval_data.files == () and train_data.packing_factor > 1
    with pytest.raises(SettingsError, match=r"^--epsilon=1e-06 and --log_epsilon=-5.0 disagree; give one of them$"):
        assemble(line(epsilon=1e-6, log_epsilon=-5.0))
    with pytest.raises(InputFilesError, match=r"is given by --input_file too; the eval set is never training input"):
        assemble(line(eval_files=f"{packed_dir}/packed-*.tfrecord", do_eval=True))
    with pytest.raises(SettingsError, match=r"^--bucket_boundaries=64,,128: expected lengths separated by commas"):
        assemble(line(bucket_boundaries=["64", "", "128"]))  # an internal error (int(''))
    with pytest.raises(SettingsError, match=r"^--log_epsilon=400.0: epsilon is 10\*\*log_epsilon"):  # a float, as the flag's
        assemble(line(log_epsilon=400))  # an internal error (OverflowError)
    with pytest.raises(SettingsError, match="--train_batch: run_pretraining has no such setting"):
        line(train_batch=4)


@pytest.mark.slow  # trains and evaluates a packed run (over 3.5 s here)
def test_cli_batch_correction_takes_packs_for_the_unpacked_rows(packed_dir, bert_config_file, tmp_path):
    out = tmp_path / "run"
    result = run_command("run_pretraining", f"--bert_config_file={bert_config_file}",
                         f"--input_files={packed_dir}/packed-*.tfrecord", f"--output_dir={out}", "--max_seq_length=128",
                         "--max_predictions_per_seq=20", "--train_batch_size=12", "--steps_per_update=2",
                         "--num_train_steps=2", "--adjust_batch_for_packing", "--do_eval")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--do_eval without --eval_files evaluates on the training files, as the reference does" in result.stderr
    packing_factor = read_dataset_info(packed_dir).packing_factor
    packs = round(12 / packing_factor)
    assert 1 < packing_factor and packs < 12
    recorded = json.loads((out / "run.json").read_text())  # the settings by their flags' names
    assert (recorded["train_batch_size"], recorded["adjust_batch_for_packing"]) == (12, True)
    assert (f"--adjust_batch_for_packing: {packs} packs a micro-batch instead of 12 rows at packing factor "
            f"{packing_factor:.3f}: {packs * 2 * packing_factor:.1f} sequences an update on average (unpacked: 24)"
            in result.stderr)
    global_batch = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(out / "mllog.txt")
                    if "global_batch_size" in line]
    assert global_batch[0]["value"] == round(packs * 2 * packing_factor)


def test_the_checks_at_start_read_each_file_s_identity_once(packed_dir, other_text_dir, bert_config_file, tmp_path,
                                                           monkeypatch):
    """On a bucket each read is a request: the set of inputs, train against eval and each file
    against its metadata.json share one reading of each file's size and first 64 KiB."""

    from bert_packed.inputs.file_identity import one_reading_per_file
    from bert_packed.storage import files
    from bert_packed.training.assemble import assemble

    opened = []
    open_file = files.open_file
    monkeypatch.setattr(files, "open_file", lambda path, mode="r": (opened.append((path, mode)), open_file(path, mode))[1])
    train, evaluation = tfrecords(packed_dir), tfrecords(other_text_dir)
    with command_in_this_process("run_pretraining") as module:
        module.FLAGS.unparse_flags()  # an earlier run's values: each run parses from the defaults
        module.FLAGS(["run_pretraining", f"--bert_config_file={bert_config_file}",
                      f"--input_files={packed_dir}/packed-*.tfrecord", f"--eval_files={other_text_dir}/part-*.tfrecord",
                      f"--output_dir={tmp_path}/run", "--max_seq_length=128", "--max_predictions_per_seq=20"])
        assemble(module.settings_from_flags())
        without = {path: opened.count((path, "rb")) for path in train + evaluation}
        opened.clear()
        with one_reading_per_file():
            assemble(module.settings_from_flags())
    assert all(without[path] >= 3 for path in train)  # expand_globs, require_disjoint, metadata.json's check
    assert [opened.count((path, "rb")) for path in train] == [1] * len(train)
    assert [opened.count((path, "rb")) for path in evaluation] == [2] * len(evaluation)  # and counted whole


@pytest.mark.parametrize("flags, message", [
    (["--max_seq_length=64"], "the data has max_seq_length=128, but --max_seq_length=64"),
    (["--max_seq_length=256"], "--max_seq_length=256 exceeds max_position_embeddings=128"),
    (["--max_sequences_per_pack=2"], "packed with max_sequences_per_pack=3, but --max_sequences_per_pack=2"),
    (["--input_mode=padded"], "packed data (metadata.json), but --input_mode=padded"),
    (["--adjust_betas_for_packing", "--input_mode=bucketed"], "--adjust_betas_for_packing needs packed data"),
    (["--adjust_batch_for_packing", "--input_mode=bucketed"], "--adjust_batch_for_packing needs packed data"),
    (["--num_warmup_steps=50"], "--num_warmup_steps=50 exceeds --num_train_steps=2"),
])
def test_cli_flags_that_disagree_stop_before_any_work(packed_dir, bert_config_file, tmp_path, flags, message):
    out = tmp_path / "run"
    result = run_command("run_pretraining", f"--bert_config_file={bert_config_file}",
                         f"--input_files={packed_dir}/packed-*.tfrecord", f"--output_dir={out}", "--max_seq_length=128",
                         "--max_predictions_per_seq=20", "--num_train_steps=2", *flags)
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]
    assert not out.exists()


def free_ports(count):
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow  # compiles a step of its own in each half precision (over 3.5 s here)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_trains_with_finite_losses(packed_dir, tmp_path, precision):
    import keras

    try:
        trainer = make_trainer(config(tmp_path, tfrecords(packed_dir), precision=precision, num_train_steps=2))
        trainer.train()
        assert trainer.model.encoder.encoder_layers[0].compute_dtype == {"bf16": "bfloat16", "fp16": "float16"}[precision]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    losses = [r["loss"] for r in read_log(tmp_path / "train_log.jsonl")]
    assert len(losses) == 2 and np.isfinite(losses).all()


@pytest.mark.slow  # compiles the step with and without XLA (over 3.5 s here)
def test_xla_gives_the_same_update(packed_dir, tmp_path):
    files = tfrecords(packed_dir)
    eager = make_trainer(config(tmp_path / "eager", files, dropout=0.0, num_train_steps=1))
    start = weights(eager)
    eager.train()
    compiled = make_trainer(config(tmp_path / "xla", files, dropout=0.0, num_train_steps=1, xla=True))
    for w, value in zip(compiled.model.weights, start):
        w.assign(value)
    compiled.train()
    for a, b in zip(weights(eager), weights(compiled)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow  # starts a run from an exported checkpoint, then again from its own damaged one (over 3.5 s here)
def test_init_checkpoint_and_a_corrupt_checkpoint(packed_dir, tmp_path, caplog):
    from bert_packed.model import BertPretrainingModel, export_google_checkpoint

    source = BertPretrainingModel(BertConfig(**TINY))
    source.build()
    path = export_google_checkpoint(source, str(tmp_path / "google"))
    trainer = make_trainer(config(tmp_path / "run", tfrecords(packed_dir), init_checkpoint=path, num_train_steps=1,
                             learning_rate=0.0))
    trainer.train()
    np.testing.assert_array_equal(trainer.model.encoder.embeddings.word_embeddings.numpy(),
                                  source.encoder.embeddings.word_embeddings.numpy())
    give_back(trainer)
    data_file = next(p for p in (tmp_path / "run" / "checkpoints").iterdir() if ".data-" in p.name)
    data_file.write_bytes(data_file.read_bytes()[:100])
    # The only checkpoint does not restore: the run stops, naming it, and leaves its logs as they are.
    with pytest.raises(TrainingError, match=rf"^{tmp_path}/run/checkpoints: no checkpoint restores: ckpt-1 \(.+\)\. "
                                            r"Stopped rather than start over .* give "
                                            r"--start_over_if_no_checkpoint_restores to train from step 0$"):
        trained(config(tmp_path / "run", tfrecords(packed_dir), init_checkpoint=path, num_train_steps=2,
                       learning_rate=0.0))
    assert re.search(r"checkpoints/ckpt-1: cannot restore this checkpoint \(.*\); trying an older one", caplog.text)
    assert [r["step"] for r in read_log(tmp_path / "run" / "train_log.jsonl")] == [1]
    # Asked to, it starts over (from init_checkpoint), saying so.
    restarted = make_trainer(config(tmp_path / "run", tfrecords(packed_dir), init_checkpoint=path, num_train_steps=2,
                                    learning_rate=0.0, start_over_if_no_checkpoint_restores=True))
    restarted.train()
    assert re.search(r"no checkpoint of \S+ restores \(ckpt-1 \(.+\)\): starting over from step 0, as "
                     r"--start_over_if_no_checkpoint_restores asks", caplog.text)
    assert [r["step"] for r in read_log(tmp_path / "run" / "train_log.jsonl")] == [1, 2]
    np.testing.assert_array_equal(restarted.model.encoder.embeddings.word_embeddings.numpy(),
                                  source.encoder.embeddings.word_embeddings.numpy())
    give_back(restarted)
    # Step 2's checkpoint damaged too: the run, asked to, starts over again and writes it anew, whole.
    from bert_packed.training.checkpoints import _unreadable

    newest = tmp_path / "run" / "checkpoints" / "ckpt-2"
    data_file = next(p for p in newest.parent.iterdir() if p.name.startswith("ckpt-2.data-"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    assert _unreadable(str(newest)) is not None
    trained(config(tmp_path / "run", tfrecords(packed_dir), init_checkpoint=path, num_train_steps=2,
                   learning_rate=0.0, start_over_if_no_checkpoint_restores=True))
    assert _unreadable(str(newest)) is None
    assert [r["step"] for r in read_log(tmp_path / "run" / "train_log.jsonl")] == [1, 2]
    # Every .index gone: the state file says a checkpoint was whole once, so the run stops too.
    for index in newest.parent.glob("*.index"):
        index.unlink()
    with pytest.raises(TrainingError, match=r"no checkpoint restores: the state file `checkpoint` is there, but no "
                                            r"ckpt-N.index beside it\. Stopped"):
        trained(config(tmp_path / "run", tfrecords(packed_dir), init_checkpoint=path, num_train_steps=2,
                       learning_rate=0.0))
    assert [r["step"] for r in read_log(tmp_path / "run" / "train_log.jsonl")] == [1, 2]


def test_the_end_of_a_run_evaluates_at_the_last_step_and_exports_its_weights(packed_dir, unpacked_dir, tmp_path):
    # Evaluations every 12 sequences fall between steps; the last step gets its own.
    files, eval_files = tfrecords(packed_dir), tuple(tfrecords(unpacked_dir))
    trainer = make_trainer(config(tmp_path / "run", files, num_train_steps=3, eval_files=eval_files,
                             eval_every_samples=12, target_mlm_accuracy=1.0))
    trainer.train()
    train_log, eval_log = read_log(tmp_path / "run" / "train_log.jsonl"), read_log(tmp_path / "run" / "eval_log.jsonl")
    assert eval_log[-1]["step"] == train_log[-1]["step"] == 3
    assert eval_log[-1]["sequences"] == train_log[-1]["sequences"]
    assert len({r["step"] for r in eval_log}) == len(eval_log)  # no step evaluated twice
    # The weights, with google-research names: the --init_checkpoint of a next phase.
    from bert_packed.model import BertPretrainingModel, google_variable_names, load_google_checkpoint

    loaded = BertPretrainingModel(BertConfig(**TINY))
    # Each layer's query, key and value are three weights there, one fused projection in the model.
    assert load_google_checkpoint(loaded, str(tmp_path / "run" / "model.ckpt-3")) == \
        len(loaded.trainable_weights) + 4 * TINY["num_hidden_layers"] == len(google_variable_names(loaded))
    for mine, theirs in zip(loaded.trainable_weights, trainer.model.trainable_weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("model.ckpt")) == [
        "model.ckpt-3.data-00000-of-00001", "model.ckpt-3.index"]  # no temporary left


def test_a_kill_before_the_end_of_a_run_is_completed_by_the_next_start(packed_dir, unpacked_dir, tmp_path,
                                                                       monkeypatch):
    import bert_packed.training.loop as loop

    files, eval_files = tfrecords(packed_dir), tuple(tfrecords(unpacked_dir))
    settings = dict(num_train_steps=2, eval_files=eval_files, eval_every_samples=0, target_mlm_accuracy=1.0)

    def killed(directory, logs, config, train_data, eval_data, step, checkpoints, reached):
        loop._save(directory, checkpoints, step, train_data)
        raise RuntimeError("killed")

    monkeypatch.setattr(loop, "_finish", killed)
    with pytest.raises(RuntimeError, match="killed"):
        trained(config(tmp_path, files, **settings))  # saved step 2, then killed: no evaluation, no export
    monkeypatch.undo()
    evaluated = (tmp_path / "eval_log.jsonl").exists() and (tmp_path / "eval_log.jsonl").read_text()
    assert not evaluated and not (tmp_path / "model.ckpt-2.index").exists()
    trained(config(tmp_path, files, **settings))
    assert [r["step"] for r in read_log(tmp_path / "eval_log.jsonl")] == [2]
    assert (tmp_path / "model.ckpt-2.index").exists()
    trained(config(tmp_path, files, **settings))  # finished: nothing more
    assert [r["step"] for r in read_log(tmp_path / "eval_log.jsonl")] == [2]
    assert [r["step"] for r in read_log(tmp_path / "train_log.jsonl")] == [1, 2]
    assert [entry["metadata"]["status"] for entry in mllog(tmp_path) if entry["key"] == "run_stop"] == ["aborted"]


def mllog(directory):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(directory / "mllog.txt")]


@pytest.mark.slow  # trains to a target, is killed and resumes (over 3.5 s here)
def test_a_kill_during_the_export_of_a_run_that_reached_its_target_is_completed(packed_dir, unpacked_dir, tmp_path,
                                                                               monkeypatch):
    import bert_packed.training.loop as trainer_module

    files, eval_files = tfrecords(packed_dir), tuple(tfrecords(unpacked_dir))
    settings = dict(num_train_steps=4, eval_files=eval_files, eval_every_samples=1, target_mlm_accuracy=0.0)
    export = trainer_module.export_google_checkpoint

    def killed(model, path, step=None):
        raise RuntimeError("killed")

    monkeypatch.setattr(trainer_module, "export_google_checkpoint", killed)
    with pytest.raises(RuntimeError, match="killed"):
        trained(config(tmp_path, files, **settings))  # reached at step 1, saved, killed exporting
    monkeypatch.setattr(trainer_module, "export_google_checkpoint", export)
    (tmp_path / "model.ckpt-1.tmp.data-00000-of-00001.tempstate8837").write_bytes(b"cut")  # SaveV2's own, killed
    trained(config(tmp_path, files, **settings))
    assert [r["step"] for r in read_log(tmp_path / "train_log.jsonl")] == [1]  # not trained on
    assert [r["step"] for r in read_log(tmp_path / "eval_log.jsonl")] == [1]
    assert (tmp_path / "model.ckpt-1.index").exists() and not list(tmp_path.glob("*.tmp*"))
    assert [entry["metadata"]["status"] for entry in mllog(tmp_path) if entry["key"] == "run_stop"] == ["success"]


def test_a_signal_during_the_evaluation_that_would_reach_the_target_stops_and_the_resume_finishes(
        packed_dir, unpacked_dir, tmp_path, monkeypatch):
    """The evaluation is abandoned (a preemptible VM's notice is too short for a whole one) and the
    checkpoint saved; the same command evaluates first, reaches the target and finishes there."""
    import bert_packed.training.loop as loop

    files, eval_files = tfrecords(packed_dir), tuple(tfrecords(unpacked_dir))
    setup = config(tmp_path, files, num_train_steps=4, eval_files=eval_files, eval_every_samples=1,
                   target_mlm_accuracy=0.0)
    trainer = make_trainer(setup)
    evaluate = loop._evaluate_and_log

    def preempted_meanwhile(*args):
        os.kill(os.getpid(), signal.SIGTERM)  # the loop's handler takes it
        return evaluate(*args)

    monkeypatch.setattr(loop, "_evaluate_and_log", preempted_meanwhile)
    trainer.train()
    assert trainer.stopped_by == "SIGTERM" and int(trainer.step) == 1
    assert "finished" not in json.loads((tmp_path / "run.json").read_text())
    assert not (tmp_path / "eval_log.jsonl").exists() or read_log(tmp_path / "eval_log.jsonl") == []
    monkeypatch.undo()
    trainer.stopped_by = None
    trainer.train()
    assert trainer.stopped_by is None
    assert json.loads((tmp_path / "run.json").read_text())["finished"] == {"step": 1, "reached": True}
    assert [r["step"] for r in read_log(tmp_path / "eval_log.jsonl")] == [1]


def test_an_output_dir_holding_another_run_is_refused_and_left_intact(packed_dir, tmp_path):
    trained(config(tmp_path, tfrecords(packed_dir), num_train_steps=1, flags_text="--seed=12345\n"))
    before = (tmp_path / "train_log.jsonl").read_text()
    from bert_packed.storage.run_directory import RunError

    with pytest.raises(RunError, match=r"holds another run \(rows_per_micro_batch: 4 there, 2 here; seed: 12345 there, 7 here; "
                                        r"train_batch_size: 4 there, 2 here\); use a new --output_dir"):
        trained(config(tmp_path, tfrecords(packed_dir), num_train_steps=2, seed=7, train_batch_size=2,
                       flags_text="--seed=7\n"))
    assert (tmp_path / "train_log.jsonl").read_text() == before
    with pytest.raises(RunError, match=r"holds another run \(learning_rate: 0.001 there, 0.0005 here\)"):
        trained(config(tmp_path, tfrecords(packed_dir), num_train_steps=2, learning_rate=5e-4,
                       flags_text="--seed=12345\n"))
    assert (tmp_path / "train_log.jsonl").read_text() == before
    assert (tmp_path / "flags.txt").read_text() == "--seed=12345\n"


@pytest.mark.slow  # compiles the step with and without a loop of updates (over 3.5 s here)
def test_a_compiled_loop_of_updates_equals_one_update_a_call(packed_dir, tmp_path):
    files = tfrecords(packed_dir)
    one = make_trainer(config(tmp_path / "one", files, num_train_steps=6))
    start = weights(one)
    one.train()
    looped = make_trainer(config(tmp_path / "looped", files, num_train_steps=6, iterations_per_loop=4))
    for w, value in zip(looped.model.weights, start):
        w.assign(value)
    calls = []
    loop = looped.update.loop
    looped.update.loop = lambda iterator, num_updates: calls.append(int(num_updates)) or loop(iterator, num_updates)
    looped.train()
    assert calls == [4, 2]  # one dispatch for 4 updates, then the 2 left
    for a, b in zip(weights(one), weights(looped)):
        np.testing.assert_array_equal(a, b)
    keys = ("step", "sequences", "loss", "mlm_accuracy", "learning_rate", "real_tokens")
    assert [[r[k] for k in keys] for r in read_log(tmp_path / "one" / "train_log.jsonl")] == [
        [r[k] for k in keys] for r in read_log(tmp_path / "looped" / "train_log.jsonl")]


@pytest.mark.slow  # compiles steps of two clip orders (over 3.5 s here)
def test_clipping_before_the_allreduce_averages_each_micro_batch_s_clipped_gradient(packed_dir, tmp_path):
    """The reference's default order, against the same update computed here by hand."""
    import tensorflow as tf

    from bert_packed.training.losses import loss_from_sums, pretraining_sums

    files = tfrecords(packed_dir)
    before = make_trainer(config(tmp_path / "before", files, dropout=0.0, steps_per_update=2, num_train_steps=2,
                            learning_rate=1e-2))
    start = weights(before)
    from bert_packed.training.data import train_pipeline
    from bert_packed.training.input_pipeline import make_dataset

    pipeline = train_pipeline(before.setup.train_data, before.config, before.compiled.batching)
    batches = list(make_dataset(pipeline).take(2))
    clipped, norms = [], []
    for features in batches:
        with tf.GradientTape() as tape:
            loss = loss_from_sums(pretraining_sums(before.model(features, training=True), features))
        gradient = [tf.convert_to_tensor(g) for g in tape.gradient(loss, before.model.trainable_variables)]
        norms.append(float(tf.linalg.global_norm(gradient)))
        clipped.append(tf.clip_by_global_norm(gradient, 1.0)[0])
    assert max(norms) > 1.0  # the clip does something
    by_hand = make_trainer(config(tmp_path / "by_hand", files, dropout=0.0, steps_per_update=2, num_train_steps=2,
                             learning_rate=1e-2))
    for w, value in zip(by_hand.model.weights, start):
        w.assign(value)
    by_hand.optimizer.apply_gradients(zip([(a + b) / 2 for a, b in zip(*clipped)], by_hand.model.trainable_variables))
    before.train()
    for a, b in zip(weights(before), weights(by_hand)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    after = make_trainer(config(tmp_path / "after", files, dropout=0.0, steps_per_update=2, num_train_steps=2,
                           learning_rate=1e-2, clip_by_global_norm_after_gradient_allreduce=True))
    for w, value in zip(after.model.weights, start):
        w.assign(value)
    after.train()
    assert any(not np.allclose(a, b, atol=1e-6) for a, b in zip(weights(before), weights(after)))


RAM = r"""
import glob, json, os, sys
import tensorflow as tf
data, bert, evaluation = sys.argv[1], sys.argv[2], sys.argv[3]
for directory, to in ((data, "ram://data/"), (evaluation, "ram://eval/")):
    for path in glob.glob(directory + "/*"):
        tf.io.gfile.copy(path, to + os.path.basename(path))
tf.io.gfile.copy(bert, "ram://config/bert_config.json")
from bert_packed.cli import run_pretraining
sys.argv = ["run_pretraining", "--bert_config_file=ram://config/bert_config.json", "--output_dir=ram://run",
            "--input_file=ram://data/packed-*.tfrecord", "--eval_files=ram://eval/part-*.tfrecord",
            "--max_seq_length=128", "--max_predictions_per_seq=20", "--max_sequences_per_pack=3",
            "--train_batch_size=4", "--num_train_steps=4", "--save_checkpoints_steps=2", "--eval_every_samples=0"]
try:
    run_pretraining.entry_point()
except SystemExit as e:
    assert not e.code, e.code
read = lambda name: tf.io.gfile.GFile("ram://run/" + name).read()
print(json.dumps({"files": sorted(tf.io.gfile.listdir("ram://run")), "train": len(read("train_log.jsonl").splitlines()),
                  "eval": json.loads(read("eval_log.jsonl").splitlines()[-1]), "run": json.loads(read("run.json")),
                  "checkpoint": tf.train.latest_checkpoint("ram://run/checkpoints"),
                  "mllog": read("mllog.txt").count(":::MLLOG"), "flags": read("flags.txt")}))
"""


@pytest.mark.slow
def test_any_tensorflow_filesystem_holds_inputs_metadata_logs_and_checkpoints(packed_dir, other_text_dir,
                                                                              bert_config_file):
    """TensorFlow's in-memory ram:// filesystem: globbing, metadata.json, logs and checkpoints."""
    result = subprocess.run([sys.executable, "-c", RAM, packed_dir, bert_config_file, other_text_dir],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"checkpoints", "eval_log.jsonl", "flags.txt", "mllog.txt", "run.json", "tensorboard",
            "train_log.jsonl"} <= set(found["files"])
    assert found["train"] == 4 and found["checkpoint"] == "ram://run/checkpoints/ckpt-4"
    assert found["eval"]["num_sequences"] == read_dataset_info(other_text_dir).num_sequences
    assert found["run"]["packing_factor"] == pytest.approx(read_dataset_info(packed_dir).packing_factor)
    assert found["mllog"] > 20 and "--output_dir=ram://run" in found["flags"]


@pytest.mark.slow  # trains, tears its log and resumes (over 3.5 s here)
def test_a_torn_last_log_line_is_dropped_and_a_damaged_one_named(packed_dir, tmp_path, caplog):
    files = tfrecords(packed_dir)
    trained(config(tmp_path, files, num_train_steps=2, save_checkpoints_steps=2))
    first = read_log(tmp_path / "train_log.jsonl")
    with open(tmp_path / "train_log.jsonl", "a") as f:
        f.write('{"step": 3, "sequences": 4')  # the power went out mid-write
    trained(config(tmp_path, files, num_train_steps=4, save_checkpoints_steps=2))
    assert "dropped its torn last line 3" in caplog.text
    resumed = read_log(tmp_path / "train_log.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4] and resumed[:2] == first
    lines = (tmp_path / "train_log.jsonl").read_text().splitlines()
    (tmp_path / "train_log.jsonl").write_text("\n".join([lines[0], "{garbage", *lines[1:]]) + "\n")
    from bert_packed.storage.run_directory import RunError

    with pytest.raises(RunError, match=r"train_log.jsonl: line 2 is not JSON"):
        trained(config(tmp_path, files, num_train_steps=6, save_checkpoints_steps=2))


@pytest.mark.slow
def test_sigterm_saves_and_exits_with_its_own_status(packed_dir, bert_config_file, tmp_path):
    """...and Ctrl-C (SIGINT) likewise, with the shell's status for it: a preemption (SIGTERM)
    stops a run, the same command resumes it, and Ctrl-C stops that one, each after saving the
    step in hand. Every path a file:// URI: through tf.io.gfile, as on a bucket."""
    import time

    out = tmp_path / "run"
    command = [sys.executable, os.path.join(REPO, "run_pretraining.py"), f"--bert_config_file=file://{bert_config_file}",
               f"--input_file=file://{packed_dir}/packed-*.tfrecord", f"--output_dir=file://{out}",
               "--max_seq_length=128", "--max_predictions_per_seq=20", "--train_batch_size=4",
               "--num_train_steps=100000", "--save_checkpoints_steps=100000"]
    deadline, step = time.time() + 300, 0
    for name, status in (("SIGTERM", 75), ("SIGINT", 130)):
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not (out / "train_log.jsonl").exists() or len(read_log(out / "train_log.jsonl")) <= step:
            assert time.time() < deadline and process.poll() is None
            time.sleep(0.2)
        process.send_signal(getattr(signal, name))
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == status, stderr[-3000:]
        assert "Traceback" not in stderr
        if step:  # the same command went on from where SIGTERM left it
            assert f"resumed from file://{out}/checkpoints/ckpt-{step} at step {step}" in stderr, stderr[-3000:]
        steps = [r["step"] for r in read_log(out / "train_log.jsonl")]
        assert steps == list(range(1, len(steps) + 1)) and steps[-1] > step  # nothing lost or repeated
        step = steps[-1]
        assert stderr.strip().splitlines()[-1] == (f"run_pretraining: stopped by {name} after saving step {step}; "
                                                   f"the same command resumes (exit status {status})")
        assert (out / "checkpoints" / f"ckpt-{step}.index").exists()


def finite(checkpoint_path):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(checkpoint_path)
    return all(np.isfinite(reader.get_tensor(name)).all()
               for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating)


@pytest.mark.parametrize("save_every", [1, 3, 100])
def test_a_diverging_run_never_saves_non_finite_weights_and_names_a_finite_checkpoint(packed_dir, tmp_path,
                                                                                      save_every):
    trainer = make_trainer(config(tmp_path, tfrecords(packed_dir), num_train_steps=12, learning_rate=1e30,
                             save_checkpoints_steps=save_every))
    with pytest.raises(TrainingError, match=r"(loss is|gradient norm is|weights at step \d+ are not finite).*the "
                                            r"last good checkpoint is") as info:
        trainer.train()
    saved = sorted(p.name[:-len(".index")] for p in (tmp_path / "checkpoints").glob("*.index")) if (
        tmp_path / "checkpoints").exists() else []
    assert all(finite(str(tmp_path / "checkpoints" / name)) for name in saved)
    named = str(info.value).rsplit("the last good checkpoint is ", 1)[1]
    assert named == "none: no checkpoint was saved yet" if not saved else finite(named)


@pytest.mark.slow  # trains, damages a checkpoint and resumes (over 3.5 s here)
def test_a_damaged_checkpoint_state_falls_back_to_the_newest_checkpoint_that_restores(packed_dir, tmp_path, caplog):
    files = tfrecords(packed_dir)
    trained(config(tmp_path / "straight", files, num_train_steps=6))
    run = tmp_path / "run"
    trained(config(run, files, num_train_steps=4, save_checkpoints_steps=2))  # ckpt-2, ckpt-4
    state = run / "checkpoints" / "checkpoint"
    for damage in (b"text garbage\n", bytes(range(256)), b'model_checkpoint_path: "ckpt-99"\n'):
        state.write_bytes(damage)
        trainer = make_trainer(config(run, files, num_train_steps=4, save_checkpoints_steps=2))
        assert trainer.checkpoints.restore().endswith("ckpt-4") and int(trainer.step.numpy()) == 4
        give_back(trainer)
        assert "damaged or out of date (it does not name ckpt-4, the newest); rewritten" in caplog.text
    data = next(p for p in (run / "checkpoints").iterdir() if p.name.startswith("ckpt-4.data"))
    data.write_bytes(data.read_bytes()[:100])  # the newest checkpoint is corrupt
    trained(config(run, files, num_train_steps=6, save_checkpoints_steps=2))
    assert "ckpt-4: cannot restore this checkpoint" in caplog.text
    assert "resumed from" in caplog.text and (run / "checkpoints" / "ckpt-2.index").exists()
    assert [r["step"] for r in read_log(run / "train_log.jsonl")] == [1, 2, 3, 4, 5, 6]


def test_a_corrupt_training_shard_is_named_with_its_record(packed_dir, tmp_path):
    from bert_packed.records import CorruptRecordError

    data = tmp_path / "data"
    data.mkdir()
    for path in tfrecords(packed_dir):
        (data / os.path.basename(path)).write_bytes(open(path, "rb").read())
    shard = tfrecords(str(data))[1]
    content = bytearray(open(shard, "rb").read())
    content[len(content) // 2] ^= 0x40
    open(shard, "wb").write(bytes(content))
    with pytest.raises(CorruptRecordError, match=rf"{shard}: record \d+: data checksum mismatch"):
        trained(config(tmp_path / "run", tfrecords(str(data)), num_train_steps=40))


def test_logs_of_a_start_that_saved_no_checkpoint_are_said_to_be_removed_not_redone(packed_dir, tmp_path, caplog):
    trained(config(tmp_path / "run", tfrecords(packed_dir), num_train_steps=2))
    shutil.rmtree(tmp_path / "run" / "checkpoints")  # as if killed before its first checkpoint
    caplog.set_level("INFO")
    trained(config(tmp_path / "run", tfrecords(packed_dir), num_train_steps=2))
    assert re.search(r"train_log\.jsonl: 2 lines logged by an earlier start that saved no checkpoint are removed: "
                     r"the run starts at step 0", caplog.text)
    assert "after the checkpoint" not in caplog.text
    assert [r["step"] for r in read_log(tmp_path / "run" / "train_log.jsonl")] == [1, 2]


@pytest.mark.slow  # hundreds of updates, twice
def test_a_signal_during_a_long_compiled_loop_stops_it_after_the_update_in_hand_and_the_run_resumes_exactly(
        packed_dir, tmp_path, caplog):
    """--iterations_per_loop=100 (the reference's is 1000): SIGTERM comes during the second
    compiled loop, and the run saves a few updates later, not at the loop's end."""
    import threading

    settings = dict(num_train_steps=300, iterations_per_loop=100, learning_rate=1e-4, log_every_steps=100)
    straight = make_trainer(config(tmp_path / "straight", tfrecords(packed_dir), **settings))
    straight.train()
    stopped = make_trainer(config(tmp_path / "stopped", tfrecords(packed_dir), **settings))
    loop, calls = stopped.update.loop, []

    def signalled_during_the_second_loop(iterator, num_updates):
        calls.append(num_updates)
        if len(calls) == 2:
            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return loop(iterator, num_updates)

    stopped.update.loop = signalled_during_the_second_loop
    caplog.set_level("INFO")
    stopped.train()
    step = int(stopped.step.numpy())
    assert stopped.stopped_by == "SIGTERM" and 100 < step < 200, step
    assert "SIGTERM: stopping after the update in hand, then saving a checkpoint" in caplog.text
    assert (tmp_path / "stopped" / "checkpoints" / f"ckpt-{step}.index").exists()
    stopped.update.loop, stopped.stopped_by = loop, None
    stopped.train()
    logs = [read_log(tmp_path / run / "train_log.jsonl") for run in ("straight", "stopped")]
    assert [r["step"] for r in logs[1]] == [r["step"] for r in logs[0]] == list(range(1, 301))
    np.testing.assert_allclose([r["loss"] for r in logs[1]], [r["loss"] for r in logs[0]], rtol=1e-6)
    for mine, theirs in zip(weights(stopped), weights(straight)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)


def test_the_time_left_is_timed_after_the_loop_that_compiled(packed_dir, tmp_path, caplog):
    caplog.set_level("INFO")
    trained(config(tmp_path / "run", tfrecords(packed_dir), num_train_steps=6, iterations_per_loop=2,
                   log_every_steps=2))
    lines = [line for line in caplog.text.splitlines() if "sequences (" in line]
    assert len(lines) == 3
    assert lines[0].endswith("time left: after the next loop (this one compiled the step)")
    assert re.search(r"about \d+ s left$", lines[1]) and lines[2].endswith("%)")


@pytest.mark.slow  # compiles a step of its own (another objective) (over 3.5 s here)
def test_masked_lm_only_trains_without_the_next_sentence_head(packed_dir, unpacked_dir, bert_config_file, tmp_path):
    """--nsp_loss=false: no pooler, no classifier, no NSP term in the loss or the logs; the weights
    export without them and load into a masked-LM-only model."""
    import tensorflow as tf

    from bert_packed.model import BertPretrainingModel, google_variable_names, load_google_checkpoint
    from bert_packed.model.checkpoint import CheckpointError

    files, eval_files = tfrecords(packed_dir), tuple(tfrecords(unpacked_dir))
    trainer = make_trainer(config(tmp_path / "run", files, num_train_steps=2, eval_files=eval_files, nsp_loss=False,
                                  target_mlm_accuracy=1.0))
    trainer.train()
    assert trainer.model.next_sentence is None
    assert not [v.path for v in trainer.model.weights if "next_sentence" in v.path]
    train_log, eval_log = read_log(tmp_path / "run" / "train_log.jsonl"), read_log(tmp_path / "run" / "eval_log.jsonl")
    assert len(train_log) == 2 and len(eval_log) == 1
    for record in train_log + eval_log:
        assert "nsp_loss" not in record and "nsp_accuracy" not in record
        assert record["loss"] == pytest.approx(record["mlm_loss"], rel=1e-6)
        assert 0.0 <= record["mlm_accuracy"] < 1.0 and record["mlm_loss"] > 1.0
    assert eval_log[0]["num_sequences"] == sum(1 for path in eval_files for _ in tf.data.TFRecordDataset(path))
    with_head = make_trainer(config(tmp_path / "run", files, eval_files=eval_files))
    with pytest.raises(TrainingError, match=r"run.json: the run was trained with --nsp_loss=false; give it to evaluate"):
        with_head.evaluate_only()
    exported = {name for name, _ in tf.train.list_variables(str(tmp_path / "run" / "model.ckpt-2"))}
    assert "cls/predictions/output_bias" in exported
    assert not {name for name in exported if name.startswith(("bert/pooler", "cls/seq_relationship"))}
    masked_lm_only = BertPretrainingModel(BertConfig(**TINY), next_sentence_prediction=False)
    assert load_google_checkpoint(masked_lm_only, str(tmp_path / "run" / "model.ckpt-2")) == len(
        google_variable_names(masked_lm_only))
    with pytest.raises(CheckpointError, match=r"no next-sentence head \(pooler, seq_relationship\): weights trained "
                                              r"with --nsp_loss=false; give --nsp_loss=false"):
        load_google_checkpoint(BertPretrainingModel(BertConfig(**TINY)), str(tmp_path / "run" / "model.ckpt-2"))
    # The run's training checkpoint, exported: the run (run.json) says the model has no head.
    result = run_command("export_model", f"--checkpoint={tmp_path / 'run' / 'checkpoints' / 'ckpt-2'}",
                         f"--bert_config_file={bert_config_file}", f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'hf'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_a_tf_config_that_cannot_be_used_is_one_line(packed_dir, bert_config_file, tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "not json")
    result = run_command("run_pretraining", f"--bert_config_file={bert_config_file}",
                         f"--input_files={packed_dir}/packed-*.tfrecord", f"--output_dir={tmp_path}",
                         "--max_seq_length=128", "--max_predictions_per_seq=20",
                         "--distribution_strategy=multi_worker_mirrored")
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("run_pretraining: error: TF_CONFIG=not json: cannot be used "
                                                     "(Expecting value: line 1 column 1 (char 0)); expected")


@pytest.mark.slow  # trains, stops by a signal and resumes, twice (over 3.5 s here)
def test_a_signal_when_an_evaluation_is_due_or_during_it_saves_first_and_the_resume_evaluates(
        packed_dir, unpacked_dir, tmp_path, monkeypatch):
    """A preemptible VM's notice is 30 s, and an evaluation of MLPerf's 10,000 sequences took longer
    than that when it ran before the save: a signal as one is due skips it, one during it abandons
    it after the batch in hand; either way the checkpoint is saved at once, and the resumed run
    does the evaluation first, so that its logs are those of a run never stopped."""
    settings = dict(num_train_steps=4, iterations_per_loop=2, eval_files=tuple(tfrecords(unpacked_dir)),
                    eval_every_samples=1, eval_batch_size=32, target_mlm_accuracy=1.0)
    straight = make_trainer(config(tmp_path / "straight", tfrecords(packed_dir), **settings))
    straight.train()
    expected = read_log(tmp_path / "straight" / "eval_log.jsonl")
    assert [r["step"] for r in expected] == [2, 4]
    for when in ("due", "during"):
        run = make_trainer(config(tmp_path / when, tfrecords(packed_dir), **settings))
        loop = run.update.loop
        if when == "due":
            sigterm_in_the_loop_from(run, 2)  # after the loop of steps 3-4, the last, as its evaluation is due
        else:
            batch, batches = run.compiled._evaluate_batch, []

            def signalled_at_the_second_batch_at_step_4(features, run=run, batch=batch, batches=batches):
                batches.append(int(run.step))
                if batches.count(4) == 2:
                    os.kill(os.getpid(), signal.SIGTERM)
                return batch(features)

            signalled_at_the_second_batch_at_step_4.get_concrete_function = batch.get_concrete_function
            monkeypatch.setattr(run.compiled, "_evaluate_batch", signalled_at_the_second_batch_at_step_4)
        run.train()
        assert run.stopped_by == "SIGTERM" and int(run.step) == 4, when
        assert [r["step"] for r in read_log(tmp_path / when / "eval_log.jsonl")] == [2], when
        assert (tmp_path / when / "checkpoints" / "ckpt-4.index").exists()
        monkeypatch.undo()
        run.update.loop, run.stopped_by = loop, None
        run.train()
        resumed = read_log(tmp_path / when / "eval_log.jsonl")
        assert [r["step"] for r in resumed] == [2, 4], when
        for mine, theirs in zip(resumed, expected):
            assert {k: v for k, v in mine.items() if k != "seconds"} == \
                {k: v for k, v in theirs.items() if k != "seconds"}, when
        train_logs = [read_log(tmp_path / name / "train_log.jsonl") for name in (when, "straight")]
        assert [r["loss"] for r in train_logs[0]] == [r["loss"] for r in train_logs[1]], when
