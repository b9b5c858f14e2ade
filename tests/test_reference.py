"""The MLPerf reference's commands run unchanged (tiny sizes substituted), and a run's mllog.txt
passes the MLPerf compliance checker.

The commands are those of the reference README (mlcommons/training, retired_benchmarks/bert): the
data preparation per part, the eval set (create, then pick_eval_samples), the GPU training
command as a flagfile, and the eval-only command. The text is tiny and repetitive, with a tiny
vocabulary, so that a tiny BERT learns it past the 0.720 target in a few hundred updates.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, run_command

from bert_packed.model import BertConfig, BertPretrainingModel, export_google_checkpoint
from bert_packed.records import read_records

WORDS = "the cat sat on a mat and dog ran to park with red ball big small house tree is".split()
SENTENCES = ["the cat sat on a mat.", "a dog ran to the park.", "the red ball is big.", "a small house with a tree."]
L, P = 32, 5


def write_text(path, num_documents, offset=0):
    """One sentence a line, a blank line between documents: the reference's cleaned-up format."""
    documents = ["\n".join(SENTENCES[(i + j) % 4] for j in range(4)) for i in range(offset, offset + num_documents)]
    path.write_text("\n\n".join(documents) + "\n")


def command(script, *args, cwd=REPO, env=None):
    return subprocess.run([sys.executable, os.path.join(REPO, script), *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def create_args(root):
    """The reference's create_pretraining_data flags, tiny sizes substituted, and one worker: the
    records are the same whatever the number (tests/test_data_create.py), and starting a pool of
    workers takes seconds."""
    return [f"--vocab_file={root}/vocab.txt", "--do_lower_case=True", f"--max_seq_length={L}",
            f"--max_predictions_per_seq={P}", "--masked_lm_prob=0.15", "--random_seed=12345", "--dupe_factor=10",
            "--num_workers=1"]


@pytest.fixture(scope="module")
def reference_inputs(tmp_path_factory):
    """The reference's text and vocabulary, its data preparation of the 2 parts, and a tiny
    bert_config.json. The commands run in this process (conftest.run_command), as they run in
    their own: create_pretraining_data runs in a subprocess in tests/test_data_create.py."""
    root = tmp_path_factory.mktemp("reference")
    (root / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + WORDS) + "\n")
    (root / "results").mkdir()
    (root / "tfrecords").mkdir()
    for part in range(2):
        write_text(root / "results" / f"part-0000{part}-of-00002", 30, offset=part)
    write_text(root / "results" / "eval.txt", 12, offset=2)
    for part in range(2):
        result = run_command("create_pretraining_data", f"--input_file={root}/results/part-0000{part}-of-00002",
                             f"--output_file={root}/tfrecords/part-0000{part}-of-00002", *create_args(root))
        assert result.returncode == 0, result.stderr[-3000:]
    config = dict(vocab_size=len(WORDS) + 6, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=128, hidden_act="gelu", hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, max_position_embeddings=L, type_vocab_size=2,
                  initializer_range=0.02)
    (root / "bert_config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def reference(reference_inputs):
    """The rest of the reference's data preparation: the eval intermediate, then eval_10k
    (pick_eval_samples, in a subprocess: the command for real, once), and the init checkpoint."""
    root = reference_inputs
    result = run_command("create_pretraining_data", f"--input_file={root}/results/eval.txt",
                         f"--output_file={root}/eval_intermediate", *create_args(root))
    assert result.returncode == 0, result.stderr[-3000:]
    result = command("scripts/pick_eval_samples.py", f"--input_tfrecord={root}/eval_intermediate",
                     f"--output_tfrecord={root}/eval_10k", "--num_examples_to_pick=40",
                     f"--max_seq_length={L}", f"--max_predictions_per_seq={P}")
    assert result.returncode == 0, result.stderr[-3000:]
    model = BertPretrainingModel(BertConfig(**json.loads((root / "bert_config.json").read_text())))
    model.build()
    export_google_checkpoint(model, str(root / "checkpoint" / "model.ckpt-28252"))
    return root


@pytest.mark.slow  # eval_10k comes from pick_eval_samples in a subprocess
def test_the_data_commands_write_plain_tfrecords_and_pick_evenly(reference):
    assert sorted(os.listdir(reference / "tfrecords")) == ["part-00000-of-00002", "part-00001-of-00002"]
    intermediate = list(read_records(str(reference / "eval_intermediate")))
    picked = list(read_records(str(reference / "eval_10k")))
    ratio = len(intermediate) / 40
    assert len(intermediate) > 40 and picked == [intermediate[int(i * ratio)] for i in range(40)]


def flagfile(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return f"--flagfile={path}"


@pytest.mark.slow  # eval_10k comes from pick_eval_samples in a subprocess
def test_the_gpu_training_command_runs_as_a_flagfile(reference, tmp_path):
    """The README's V100 command; tiny sizes, and --num_gpus=0 for a machine without GPUs."""
    result = run_command("run_pretraining", flagfile(tmp_path / "train.cfg", [
        f"--bert_config_file={reference}/bert_config.json", f"--output_dir={tmp_path}/output/",
        f"--input_file={reference}/tfrecords/part*", "--nodo_eval", "--do_train", "--eval_batch_size=8",
        "--learning_rate=0.0001", f"--init_checkpoint={reference}/checkpoint/model.ckpt-28252",
        "--iterations_per_loop=1000", f"--max_predictions_per_seq={P}", f"--max_seq_length={L}",
        "--num_train_steps=6", "--num_warmup_steps=2", "--optimizer=lamb", "--save_checkpoints_steps=3",
        "--start_warmup_step=0", "--num_gpus=0", "--train_batch_size=4"]))
    assert result.returncode == 0, result.stderr[-3000:]
    log = [json.loads(line) for line in open(tmp_path / "output" / "train_log.jsonl")]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6] and all(r["sequences"] == 4 * r["step"] for r in log)
    assert log[0]["learning_rate"] == 0.0 and log[1]["learning_rate"] == pytest.approx(5e-5)  # warmup from 0
    # Checkpoints fall between compiled loops, as on the reference's TPU; the run says so.
    assert "--save_checkpoints_steps=3 is not a multiple of the loop of 1000 micro-steps" in result.stderr
    # The reference's files have no metadata.json: said once, and their sequences counted for mllog.txt.
    assert result.stderr.count("no metadata.json") == 1
    mllog = {entry["key"]: entry["value"] for entry in
             (json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(tmp_path / "output" / "mllog.txt"))}
    records = sum(len(list(read_records(str(path)))) for path in (reference / "tfrecords").iterdir())
    assert mllog["train_samples"] == records > 0
    # --nodo_eval: the log cannot pass the checker in any division; said at the start and at the end.
    assert "this run does not evaluate (no eval files): its mllog.txt cannot pass" in result.stderr
    assert result.stdout.splitlines()[-1] == ("mllog.txt: does not pass the MLPerf compliance checker: it holds no "
                                              "evaluation (eval_accuracy), which every division requires; train "
                                              "with eval files")


@pytest.mark.slow  # evaluates in a subprocess: its stderr is the one warning, TensorFlow's logs included
def test_the_eval_command_evaluates_the_init_checkpoint(reference, tmp_path):
    """The eval command as a user's process runs it, with Keras's backend set to jax for the user's
    other work (an internal error, once): a command runs Keras on TensorFlow's."""
    result = command("run_pretraining.py", flagfile(tmp_path / "eval.cfg", [
        f"--bert_config_file={reference}/bert_config.json", f"--output_dir={tmp_path}/output/",
        f"--input_file={reference}/eval_10k", "--do_eval", "--nodo_train", "--eval_batch_size=8",
        f"--init_checkpoint={reference}/checkpoint/model.ckpt-28252", "--iterations_per_loop=1000",
        "--learning_rate=0.0001", "--max_eval_steps=4", f"--max_predictions_per_seq={P}", f"--max_seq_length={L}",
        "--num_gpus=0", "--num_train_steps=107538", "--num_warmup_steps=1562", "--optimizer=lamb",
        "--save_checkpoints_steps=1562", "--start_warmup_step=0", "--train_batch_size=24", "--nouse_tpu"]),
        env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    # One line on stderr: the files' missing metadata.json (no training notes: nothing trains).
    assert result.stderr.splitlines() == ["warning: --input_file: no metadata.json beside the files; cannot check "
                                          "them against the flags"]
    results = dict(line.split(" = ", 1) for line in (tmp_path / "output" / "eval_results.txt").read_text().splitlines())
    assert float(results["num_sequences"]) == 32  # --max_eval_steps=4 batches of 8
    assert results["checkpoint"].endswith("model.ckpt-28252") and 0.0 <= float(results["mlm_accuracy"]) < 0.5
    assert results["step"] == "28252"  # the checkpoint's own step, from its name
    assert result.stdout.strip() == (f"run_pretraining: evaluated {results['checkpoint']} (step 28252): masked-LM "
                                     f"accuracy {float(results['mlm_accuracy']):.4f}, loss {float(results['loss']):.4f} "
                                     f"over 32 sequences -> {tmp_path}/output/eval_results.txt")


@pytest.mark.slow  # trains 600 updates; the compliance checker and pick_eval_samples (eval_10k) run as processes
def test_a_run_that_reaches_the_target_passes_the_compliance_checker(reference, tmp_path):
    out = tmp_path / "run"
    result = run_command("run_pretraining", f"--bert_config_file={reference}/bert_config.json",
                         f"--input_file={reference}/tfrecords/part*", f"--eval_files={reference}/eval_10k",
                         f"--output_dir={out}", f"--max_seq_length={L}", f"--max_predictions_per_seq={P}",
                         "--train_batch_size=32", "--learning_rate=0.03", "--num_train_steps=600", "--num_warmup_steps=20",
                         "--eval_every_samples=640", "--iterations_per_loop=10", "--deterministic", "--log_epsilon=-6",
                         "--submission_org=bert-packed tests", "--submission_platform=cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    evaluations = [json.loads(line) for line in open(out / "eval_log.jsonl")]
    assert 0.720 <= evaluations[-1]["mlm_accuracy"] < 1.0 and len(evaluations) > 1
    lines = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in open(out / "mllog.txt")]
    assert all(entry["metadata"]["file"] == "bert_packed/training/mlperf_log.py" for entry in lines)
    assert {entry["key"]: entry["value"] for entry in lines}["opt_lamb_epsilon"] == pytest.approx(1e-6)
    epochs = [entry["metadata"]["epoch_num"] for entry in lines if entry["key"] == "eval_accuracy"]
    assert epochs == [r["sequences"] for r in evaluations]  # samples: sequences
    checker = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                              "--ruleset", "5.0.0", "--werror", str(out / "mllog.txt")],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
    output = checker.stdout + checker.stderr
    assert checker.returncode == 0 and "SUCCESS" in output, output
    assert "ERROR" not in output and "WARNING" not in output, output


@pytest.mark.parametrize("flags, message", [
    (["--input_files=a", "--input_file=b"], "--input_files=a and --input_file=b disagree"),
    (["--epsilon=1e-8", "--log_epsilon=-6"], "--epsilon=1e-08 and --log_epsilon=-6.0 disagree"),
    (["--nodo_train", "--nodo_eval"], "--do_train and --do_eval are both false"),
    (["--master=grpc://10.0.0.2:8470"], "--master=grpc://10.0.0.2:8470: cannot be honoured without --use_tpu"),
    (["--num_gpus=2"], "--num_gpus=2: cannot be honoured, 0 GPUs are visible"),
    (["--use_tpu", "--tpu_name=x", "--distribution_strategy=mirrored"],
     "--use_tpu asks for --distribution_strategy=tpu, but --distribution_strategy=mirrored"),
    (["--use_tpu"], "--use_tpu (--distribution_strategy=tpu) needs --tpu_name"),
    (["--input_file=nosuchfs://bucket/part-*"], "--input_file: 'nosuchfs://bucket/part-*'"),
])
def test_reference_flags_that_cannot_work_stop_before_anything_is_written(reference_inputs, tmp_path, flags, message):
    out = tmp_path / "run"
    base = [f"--bert_config_file={reference_inputs}/bert_config.json", f"--output_dir={out}", f"--max_seq_length={L}",
            f"--max_predictions_per_seq={P}"]
    if not any(flag.startswith("--input_file") for flag in flags):
        base.append(f"--input_file={reference_inputs}/tfrecords/part*")
    result = run_command("run_pretraining", *base, *flags)
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr.strip().splitlines()[-1] and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.slow  # trains with micro-steps, a step of its own (over 3.5 s here)
def test_a_micro_step_count_is_the_reference_s(reference_inputs, tmp_path):
    """--steps_per_update=2: num_train_steps, warmup and the checkpoint cadence count micro-steps."""
    out = tmp_path / "run"
    result = run_command("run_pretraining", f"--bert_config_file={reference_inputs}/bert_config.json",
                         f"--input_file={reference_inputs}/tfrecords/part*", f"--output_dir={out}",
                         f"--max_seq_length={L}", f"--max_predictions_per_seq={P}", "--train_batch_size=4",
                         "--steps_per_update=2", "--num_train_steps=8", "--num_warmup_steps=4", "--learning_rate=1e-3",
                         "--save_checkpoints_steps=4")
    assert result.returncode == 0, result.stderr[-3000:]
    log = [json.loads(line) for line in open(out / "train_log.jsonl")]
    assert [r["step"] for r in log] == [2, 4, 6, 8]  # 4 updates of 2 micro-steps
    assert np.allclose([r["learning_rate"] for r in log], [0.0, 5e-4, 1e-3 * (1 - 4 / 8), 1e-3 * (1 - 6 / 8)])
    assert sorted(name for name in os.listdir(out / "checkpoints") if name.endswith(".index")) == [
        "ckpt-4.index", "ckpt-8.index"]
