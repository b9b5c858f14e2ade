"""The install's check (bert-packed-doctor) and the device check (scripts/device_check.py), on this CPU."""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import STEPS, run_command, run_script

from bert_packed.features import Shapes
from bert_packed.training import doctor


@pytest.mark.slow
def test_the_doctor_on_a_machine_without_a_gpu_says_so_and_checks_the_cpu():
    result = run_command("doctor")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ok      TensorFlow") and f"{tf.__version__}, a CPU build (no CUDA)" in lines[0]
    assert any(line.startswith("ok      GPUs") and "none: no NVIDIA driver found" in line for line in lines)
    assert any(line.startswith("ok      XLA") and "compiles and runs on /CPU:0" in line for line in lines)
    packed = next(line for line in lines if line.startswith("ok      packed training"))
    agreement = float(packed.split("agree to ")[1].split(" of")[0])
    assert 0 <= agreement <= doctor.PACKED_TOLERANCE
    assert lines[-1] == "bert-packed-doctor: no problem found"


def test_a_gpu_the_driver_lists_but_a_cpu_build_cannot_use_is_one_problem_with_its_fix(monkeypatch):
    monkeypatch.setattr(doctor, "driver_gpus", lambda: ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"])
    (finding,) = doctor.gpus()
    assert finding.found == "the driver lists 1 (NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04); this TensorFlow is a CPU build"
    assert finding.fix.startswith("install the GPU build beside nothing else: pip uninstall tensorflow-cpu, then pip install")
    from bert_packed.cli.doctor import report

    lines, problems = report([doctor.Finding("TensorFlow", "2.21.0"), finding])
    assert problems == 1 and lines[1].startswith("PROBLEM GPUs") and lines[2].strip().startswith("fix: install the GPU")


@pytest.mark.slow  # trains packed and one-a-row runs (over 3.5 s here)
def test_the_packed_training_check_fails_when_packed_rows_are_computed_wrongly(monkeypatch):
    """A pack whose sequences' tokens leak into each other (a mask that lets attention cross
    sequences) trains other weights than the sequences one a row: the check says so, though
    the other three packs of the batch are right (the check compares all weights at once:
    2.9e-2 of their change here, against a tolerance of 1e-4)."""
    layouts = doctor.same_sequences_packed_or_not

    def leaking(shapes, count, vocab_size, **kwargs):
        packed, one_a_row = layouts(shapes, count, vocab_size, **kwargs)
        sequence_ids = packed["sequence_ids"].numpy()
        sequence_ids[0] = np.minimum(sequence_ids[0], 1)  # the first pack's sequences as one
        return {**packed, "sequence_ids": tf.constant(sequence_ids)}, one_a_row

    monkeypatch.setattr(doctor, "same_sequences_packed_or_not", leaking)
    (finding,) = doctor.packed_updates("/CPU:0", steps=STEPS)
    assert finding.fix is not None and "computes packed rows wrongly" in finding.fix


def test_the_packed_training_check_compares_all_weights_and_names_weights_that_do_not_train():
    start = [np.zeros((3, 4)), np.zeros(4)]
    packed = [np.ones((3, 4)), np.ones(4)]  # moved by 4 over all 16
    losses = np.array([4.5, 4.25])
    nearly = [packed[0] + 1e-4, packed[1]]  # 1e-4 * sqrt(12) / 4 = 8.7e-5 of the change

    def check(padded, after=packed):
        return doctor.weights_agree(after, padded, start, "3 updates on /CPU:0", losses)

    assert check(nearly) == doctor.Finding(
        "packed training", "3 updates on /CPU:0: packed and one-a-row weights agree to 8.7e-05 of their change "
                           "(MLM loss 4.500 -> 4.250)")
    leaking = check([packed[0], packed[1] + [0, 0, 0, 1e-3]])  # one weight of 16 off by 1e-3: 2.5e-4
    assert "agree to 2.5e-04" in leaking.found and "more than 0.0001: this device computes packed rows wrongly" in leaking.fix
    assert check(packed, after=start).found == "3 updates on /CPU:0: the weights did not move"
    not_finite = check([packed[0], np.array([1, 1, np.nan, 1])])
    assert not_finite.found == "3 updates on /CPU:0: the weights are not finite"
    assert not_finite.fix == "this device does not train; report it with this line"


def test_the_same_sequences_packed_or_one_a_row_hold_the_same_tokens_and_predictions():
    packed, one_a_row = doctor.same_sequences_packed_or_not(Shapes(64, 8, 3), 12, 100)
    assert packed["input_ids"].shape == (4, 64) and one_a_row["input_ids"].shape == (12, 64)
    for name in ("input_ids", "masked_lm_ids"):
        ids = lambda features, name=name: np.sort(features[name].numpy()[features[name].numpy() > 0])
        np.testing.assert_array_equal(ids(packed), ids(one_a_row))
    assert set(np.unique(packed["sequence_ids"].numpy())) == {0, 1, 2, 3}
    assert int(tf.reduce_sum(packed["next_sentence_weights"])) == 12


@pytest.mark.slow  # compiles steps of its own at L=512 (over 3.5 s here)
def test_the_device_check_runs_on_the_cpu_with_a_micro_config(tmp_path):
    """Every check of the command, on a BERT of one narrow layer at L=512 (the tiny config's 2 x
    128 and 30,522 tokens took a third longer, in compiling)."""
    from tensorflow.python.eager import context

    output, config = tmp_path / "device_check.json", tmp_path / "bert_config.json"
    config.write_text(json.dumps({"vocab_size": 1024, "hidden_size": 32, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512}))
    # No global seed, as in a new process: the shuffles of the batches timed combine theirs with it,
    # and a test that trained before in this process may have left its own.
    left = context.global_seed()
    tf.random.set_seed(None)
    try:
        result = run_script("device_check", f"--bert_config={config}", "--check_layers=1", "--batch_size=2",
                            "--sequences=200", "--rounds=1", "--updates=1", f"--output_json={output}", cwd=str(tmp_path))
    finally:
        tf.random.set_seed(left)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(output.read_text())
    assert figures["device"] == "CPU" and figures["bert_config"]["hidden_size"] == 32 and figures["failed"] == []
    for precision in ("fp32", "bf16"):
        measured = figures["packed_equals_unpacked"][precision]
        assert all(measured[name] <= bound for name, bound in zip(("loss", "logits", "gradients"),
                                                                   measured["tolerances"]))
    assert max(figures["recompute"].values()) <= 1e-6
    assert figures["deterministic"]["bit_equal"] is True
    assert figures["throughput"]["rows_a_micro_batch"] == 2 and 1.6 < figures["throughput"]["packing_factor"] < 2.4
    assert figures["throughput"]["packed"]["sequences_per_second"] > 0
    table = result.stdout.splitlines()
    assert "| check | result | passed |" in table and table[-1] == "device_check: every check passed"
    # One headline: the speed-up in real tokens/s against what packing promises in real tokens a row
    # of the batches timed. Here one update of two rows: two full packs against two sequences of
    # Wikipedia's lengths, 5.1x, further from the packing factor than the data's ratio, and the
    # same run after run (the batches come in one order; it was 1.9-10.5 when they did not).
    assert 2 < figures["throughput"]["promised_speedup"] < 8 and figures["throughput"]["speedup"] > 0
    assert any(line.startswith("| packed speed-up, real tokens/s | speed-up ") and "real-token ratio" in line
               and "(sequences/s " in line for line in table)
