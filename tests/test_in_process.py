"""The in-process runner (bert_packed.cli.in_process): a command run in this process leaves the
process as a command run in its own leaves its parent."""

import logging
import random

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_command
from tensorflow.python.eager import context
from tensorflow.python.framework import config as tf_config


def training_state():
    return (tf_config.is_op_determinism_enabled(), context.global_seed(), keras.mixed_precision.global_policy().name,
            random.getstate(), np.random.get_state()[1].tolist())


@pytest.mark.slow  # compiles a deterministic bf16 step of its own (over 3.5 s here)
def test_a_deterministic_bf16_run_leaves_determinism_seeds_and_precision_as_they_were(packed_dir, bert_config_file,
                                                                                      tmp_path):
    found = training_state()
    try:
        tf_config.disable_op_determinism()  # other tests' runs leave it on
        tf.random.set_seed(11)
        keras.mixed_precision.set_global_policy("float32")
        random.seed(3)
        np.random.seed(3)
        before = training_state()
        result = run_command("run_pretraining", f"--bert_config_file={bert_config_file}",
                             f"--input_files={packed_dir}/packed-*.tfrecord", f"--output_dir={tmp_path / 'run'}",
                             "--max_seq_length=128", "--max_predictions_per_seq=20", "--train_batch_size=4",
                             "--num_train_steps=1", "--deterministic", "--seed=5", "--precision=bf16")
        assert result.returncode == 0, result.stderr[-3000:]
        assert training_state() == before
        assert before[:3] == (False, 11, "float32")
    finally:
        (tf_config.enable_op_determinism if found[0] else tf_config.disable_op_determinism)()
        tf.random.set_seed(found[1])
        keras.mixed_precision.set_global_policy(found[2])


def test_unparsing_a_command_s_flags_gives_the_root_logger_no_handler_of_its_own(monkeypatch):
    """absl logs a line as it unparses flags (each run of a command starts so); with no handler on
    the root logger (a plain Python process), Python would add one of its own, and the next command
    showed every line twice."""
    import logging

    from absl import flags

    from bert_packed.cli import common

    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    common.unparse(flags.FlagValues())
    assert logging.getLogger().handlers == []


@pytest.mark.slow  # trains three runs in turn (over 3.5 s here)
def test_runs_given_one_step_pool_share_a_compiled_step_put_back_as_new(packed_dir, bert_config_file, tmp_path,
                                                                      monkeypatch):
    """run_pretraining twice with one StepPool, as a function and as a command run in this
    process: the second trains on the step the first released, compiles nothing, and leaves
    exactly what the first left (and a notebook's logging as it was); a pool that keeps no bytes
    lets its step go, and the next run builds one."""
    from training_runs import read_log

    from bert_packed.cli.in_process import run_in_process
    from bert_packed.training import step as steps
    from bert_packed.training.pretraining import PretrainingSettings, run_pretraining
    from bert_packed.training.step_pool import StepPool

    built = []
    build = steps.CompiledStep.__init__
    monkeypatch.setattr(steps.CompiledStep, "__init__", lambda *args, **kwargs: built.append(1) or build(*args, **kwargs))
    given = dict(bert_config_file=bert_config_file, input_files=f"{packed_dir}/packed-*.tfrecord", max_seq_length=128,
                 max_predictions_per_seq=20, train_batch_size=4, num_train_steps=3, learning_rate=1e-3,
                 deterministic=True, seed=731)
    pool = StepPool()

    def losses(name):
        return [(line["step"], line["loss"]) for line in read_log(tmp_path / name / "train_log.jsonl")]

    root = logging.getLogger()
    pytest_s = (root.level, list(root.handlers))
    root.setLevel(logging.WARNING)  # a notebook's root logger: WARNING, no handler
    root.handlers[:] = []
    try:
        first = run_pretraining(PretrainingSettings.of(output_dir=str(tmp_path / "first"), **given), pool)
        logging_after = (root.level, list(root.handlers))
    finally:
        root.setLevel(pytest_s[0])
        root.handlers[:] = pytest_s[1]
    assert logging_after == (logging.WARNING, [])  # its INFO lines, and the compliance checker's handler, gone
    assert (first.run.step, first.run.stopped_by, first.directory.path) == (3, None, str(tmp_path / "first"))
    assert any("sequences" in line for line in first.summary), first.summary
    assert built == [1] and pool.held() == [] and len(pool.kept()) == 1
    kept = pool.kept()[0]
    kept.update.stop_requested.assign(1)  # a signal after its run let it go: the next run starts without it
    args = [f"--{name}={value}" for name, value in given.items() if name != "deterministic"]
    status = run_in_process("bert_packed.cli.run_pretraining", [*args, "--deterministic",
                                                               f"--output_dir={tmp_path / 'second'}"], steps=pool)
    assert status == 0
    assert losses("second") == losses("first") and built == [1] and pool.kept() == [kept]  # the first run's step
    weights = [tf.train.load_checkpoint(str(tmp_path / name / "model.ckpt-3")) for name in ("first", "second")]
    names = [name for name, _ in tf.train.list_variables(str(tmp_path / "first" / "model.ckpt-3"))]
    assert len(names) > 20
    for name in names:
        np.testing.assert_array_equal(weights[0].get_tensor(name), weights[1].get_tensor(name))
    pool.kept_bytes = 0  # from here, no step is kept when its run ends
    third = run_pretraining(PretrainingSettings.of(output_dir=str(tmp_path / "third"), **given), pool)
    assert losses("third") == losses("first") and third.run.step == 3
    assert built == [1] and pool.kept() == []  # the kept one again, let go after
    run_pretraining(PretrainingSettings.of(output_dir=str(tmp_path / "fourth"), **given), pool)
    assert losses("fourth") == losses("first") and built == [1, 1]  # a new one


def test_a_step_under_a_strategy_of_its_command_s_own_is_let_go_with_the_command(tmp_path):
    """A command makes its own strategy (mirrored, multi-worker, TPU): no later command can run
    its step, so a pool does not keep it, unless its owner keeps its strategies (the tests do)."""
    from training_runs import _set_up_unless_in_place, config

    from bert_packed.training.step_pool import StepPool

    setup = config(tmp_path, [], train_batch_size=2)
    _set_up_unless_in_place(setup.config)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    pool = StepPool()
    mirrored = pool.take(setup.config, setup.train_data, strategy)
    default = pool.take(setup.config, setup.train_data)
    assert pool.held() == [mirrored, default]
    pool.release()
    assert pool.held() == [] and pool.kept() == [default]
    again = pool.take(setup.config, setup.train_data, strategy)
    assert again is not mirrored
    keeping = StepPool(strategies_kept=True)
    step = keeping.take(setup.config, setup.train_data, strategy)
    keeping.release(step)
    assert keeping.kept() == [step] and keeping.take(setup.config, setup.train_data, strategy) is step


def test_a_step_built_under_a_device_scope_is_handed_out_again_only_under_that_scope(tmp_path):
    """The doctor takes its steps under `tf.device(the first GPU)`: a run outside that scope (or
    under another) gets a step of its own, whose variables live where it runs."""
    from training_runs import _set_up_unless_in_place, config

    from bert_packed.training.step_pool import StepPool

    setup = config(tmp_path, [], train_batch_size=2)
    _set_up_unless_in_place(setup.config)
    pool = StepPool()
    with tf.device("/CPU:0"):
        scoped = pool.take(setup.config, setup.train_data)
    pool.release()
    unscoped = pool.take(setup.config, setup.train_data)
    assert unscoped is not scoped
    pool.release()
    with tf.device("/CPU:0"):
        assert pool.take(setup.config, setup.train_data) is scoped
    assert pool.take(setup.config, setup.train_data) is unscoped


def test_each_command_draws_from_generators_seeded_afresh_and_leaves_the_caller_s_as_they_were():
    """As a new process's: a run without --deterministic takes its initial weights from Python's
    random generator, and two such runs one after another in this process started alike."""
    from conftest import command_in_this_process

    random.seed(3)
    np.random.seed(3)
    caller = training_state()[3:]
    draws = []
    for _ in range(2):
        with command_in_this_process("plan_packing"):
            draws.append((random.random(), float(np.random.rand())))
        assert training_state()[3:] == caller
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1]


def test_a_command_run_within_another_leaves_its_flags_and_starts_from_its_own_defaults(tmp_path, capsys):
    """A job's command runs within the job's: each keeps its flags in a FlagValues of its own, none
    in absl's global one, and each run starts from its defaults (a flag given to one run is not
    the next run's)."""
    import importlib

    from absl import flags

    from bert_packed.cli import in_process

    (tmp_path / "h.json").write_text("[0, 1, 1, 2]")
    pick = importlib.import_module("bert_packed.cli.pick_eval_samples")
    with in_process.command_in_this_process("bert_packed.cli.pick_eval_samples"):
        pick.FLAGS(["pick_eval_samples", "--input_tfrecord=a", "--output_tfrecord=b", "--num_examples_to_pick=7"])
        statuses = [in_process.run_in_process("bert_packed.cli.plan_packing", [f"--histogram={tmp_path / 'h.json'}",
                                                                                *json]) for json in (["--json"], [])]
        assert (pick.FLAGS.input_tfrecord, pick.FLAGS.num_examples_to_pick) == ("a", 7)
    assert statuses == [0, 0], capsys.readouterr().err[-2000:]
    first, second = capsys.readouterr().out.split("\n", 1)
    assert first.startswith("{") and "packing factor" in second  # the second run's output is the table again
    assert "histogram" not in flags.FLAGS and "input_tfrecord" not in flags.FLAGS


def test_a_program_that_runs_a_command_keeps_its_own_flags_and_absl_s(tmp_path, capsys):
    """A program of its own (a job, a user's absl program) that runs a command in its process:
    the command neither takes that program's flags nor leaves absl's process-wide ones (--verbosity)
    as it parsed them."""
    from absl import flags
    from absl.testing import flagsaver

    from bert_packed.cli import in_process

    (tmp_path / "h.json").write_text("[0, 1, 1, 2]")
    flags.DEFINE_string("a_caller_s_flag", None, "The caller's own.")
    saved = flagsaver.save_flag_values(flags.FLAGS)
    try:
        flags.FLAGS(["caller", "--a_caller_s_flag=results.json", "--verbosity=1"])
        statuses = [in_process.run_in_process("bert_packed.cli.plan_packing", [f"--histogram={tmp_path / 'h.json'}",
                                                                                *more])
                    for more in ([], ["--a_caller_s_flag=oops"])]
        assert (flags.FLAGS.a_caller_s_flag, flags.FLAGS.verbosity) == ("results.json", 1)
    finally:
        flagsaver.restore_flag_values(saved, flags.FLAGS)
        delattr(flags.FLAGS, "a_caller_s_flag")
    assert statuses == [0, 2]
    assert "Unknown command line flag 'a_caller_s_flag'" in capsys.readouterr().err
