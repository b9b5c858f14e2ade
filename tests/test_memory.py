"""The memory plan: a replica's bytes from the measured step, and the run's refusal of a micro-batch
that cannot fit (the device's memory given by a test-only override: this machine has no GPU)."""

import dataclasses
import json

import pytest
from conftest import MAX_SEQ_LENGTH, REPO, run_command, tfrecords

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.model import BertConfig
from bert_packed.training import memory
from bert_packed.training.config import make_config
from bert_packed.training.data import TrainData

LARGE = BertConfig.from_json_file(f"{REPO}/configs/bert_config_large.json")
SIZES = {**memory.model_sizes(LARGE), "vocab_size": LARGE.vocab_size}
GB = 10**9
PACKS = TrainData(shapes=Shapes(512, 76, 3), input_mode="packed", packing_factor=2.0)
# A plan of round numbers: at L=128, 2 GB fixed and 0.1 GB a row; at L=512, 2.2 GB and 1 GB a row.
PLAN = (memory.Measured(SIZES, 128, "bf16", "none", 2 * GB, GB // 10, "test"),
        memory.Measured(SIZES, 512, "bf16", "none", 22 * GB // 10, GB, "test"),
        memory.Measured(SIZES, 512, "bf16", "attention", 22 * GB // 10, GB // 4, "test"))


def test_the_parameter_count_is_the_model_s():
    from bert_packed.model import BertPretrainingModel

    for bert, head in ((BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=48, max_position_embeddings=64), True),
                       (BertConfig(vocab_size=90, hidden_size=16, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=40, max_position_embeddings=32), False)):
        model = BertPretrainingModel(bert, next_sentence_prediction=head)
        model.build()
        assert memory.parameter_count(bert, head) == sum(int(w.numpy().size) for w in model.weights)


def test_a_replica_s_bytes_are_the_measured_step_s_and_the_optimizer_s():
    optimizer = memory.optimizer_bytes(LARGE)
    assert optimizer == 4 * (3 * memory.parameter_count(LARGE) + 4 * LARGE.vocab_size * LARGE.hidden_size)
    assert memory.step_bytes(LARGE, 512, "bf16", "none", 3, PLAN) == 22 * GB // 10 + 3 * GB + optimizer
    assert memory.step_bytes(LARGE, 128, "bf16", "none", 10, PLAN) == 2 * GB + GB + optimizer
    # Between two measured lengths, per_row = a L + b L^2 through both, fixed linear.
    fixed, per_row = memory.step_line(LARGE, 256, "bf16", "none", PLAN)
    b = (GB / 512 - GB / 10 / 128) / (512 - 128)
    assert per_row == round((GB / 10 / 128 - b * 128) * 256 + b * 256**2)
    assert fixed == round(2 * GB + 0.2 * GB * (256 - 128) / 384) + optimizer
    # Another vocabulary: its weights, gradients and moments, 16 bytes a weight.
    other = dataclasses.replace(LARGE, vocab_size=LARGE.vocab_size + 1000)
    assert memory.step_line(other, 512, "bf16", "none", PLAN)[0] == \
        memory.step_line(LARGE, 512, "bf16", "none", PLAN)[0] + 16 * 1000 * 1024 + memory.optimizer_bytes(other) - optimizer
    # Unmeasured: another precision, a length beyond the measured ones, another model.
    assert memory.step_bytes(LARGE, 512, "fp32", "none", 1, PLAN) is None
    assert memory.step_bytes(LARGE, 1024, "bf16", "none", 1, PLAN) is None
    assert memory.step_bytes(dataclasses.replace(LARGE, num_hidden_layers=12), 512, "bf16", "none", 1, PLAN) is None


def test_a_micro_batch_that_cannot_fit_names_the_largest_that_does_and_the_accumulation_that_keeps_the_batch():
    optimizer = memory.optimizer_bytes(LARGE)
    device = 40 * GB + optimizer  # 0.95 of it less the fixed bytes: 35.8 GB, 35 rows of 1 GB
    assert memory.largest_rows(LARGE, 512, "bf16", "none", device, PLAN) == int((device * 0.95 - 2.2 * GB - optimizer) // GB)
    config = lambda rows, recompute="none": make_config(bert=LARGE, precision="bf16", recompute=recompute, xla=True,
                                                       train_batch_size=rows, num_train_steps=6700, output_dir="run")
    check = lambda rows, recompute="none": memory.check_micro_batch(config(rows, recompute), PACKS, 8, device,
                                                                    "Test GPU", PLAN)
    assert check(8 * 30).startswith("memory: 30 rows of 512 a replica need about ")
    with pytest.raises(SettingsError) as refused:
        check(448)
    message = str(refused.value)
    assert message.startswith("--train_batch_size=448: 56 rows of 512 a replica need about ")
    assert "Test GPU has " in message and "at most 35 rows fit" in message
    assert ("--train_batch_size=224 --steps_per_update=2 --num_train_steps=13400 keep the 448 rows an update and the "
            "6700 updates") in message
    assert "or --recompute=attention fits 56 rows" in message and message.endswith("(docs/launch.md#memory)")
    assert check(448, "attention").startswith("memory: 56 rows")
    with pytest.raises(SettingsError, match="not even one row fits"):
        memory.check_micro_batch(config(8), PACKS, 8, 2 * GB, "Test GPU", PLAN)


def test_with_batch_correction_the_advice_splits_the_unpacked_rows():
    """--adjust_batch_for_packing: 448 unpacked rows at packing factor 1.946 are 230 packs on one
    replica; halved, 224 rows are 115 packs, quartered 112 rows 58 packs."""
    optimizer = memory.optimizer_bytes(LARGE)
    config = make_config(bert=LARGE, precision="bf16", xla=True, train_batch_size=448, adjust_batch_for_packing=True,
                         num_train_steps=6700, output_dir="run")
    data = dataclasses.replace(PACKS, packing_factor=1.946)
    with pytest.raises(SettingsError) as refused:
        memory.check_micro_batch(config, data, 1, 70 * GB + optimizer, "Test GPU", PLAN)
    message = str(refused.value)
    assert message.startswith("--train_batch_size=448: 230 rows of 512 a replica need about ")
    assert "at most 64 rows fit: --train_batch_size=112 --steps_per_update=4 --num_train_steps=26800 keep" in message


def test_on_a_machine_without_a_gpu_there_is_no_device_memory_to_check():
    import tensorflow as tf

    assert memory.device_memory(tf.distribute.get_strategy()) is None
    assert memory.device_memory(tf.distribute.MirroredStrategy(["/cpu:0"])) is None


def test_the_shipped_plan_is_never_below_a_measurement_and_covers_bert_large_in_bf16():
    """resources/memory_plan.json against the measurements it was fitted to (docs/measurements):
    at every row count its source measured, the plan's compiled step holds at least what XLA
    assigned."""
    import json
    import re

    measured = {}  # measured_by -> {configuration: bytes}
    for name in ("memory_h100.json", "memory_cpu.json"):
        with open(f"{REPO}/docs/measurements/{name}") as f:
            given = json.load(f)
        measured[given["measured_by"]] = given["bytes"]
    plan = memory.read_plan()
    names = {}
    for name in ("tiny", "base", "large"):
        bert = BertConfig.from_json_file(f"{REPO}/configs/bert_config_{name}.json")
        names[(bert.hidden_size, bert.num_hidden_layers)] = name
    checked = 0
    for line in plan:
        name = names[(line.model["hidden_size"], line.model["num_hidden_layers"])]
        for key, value in measured[line.measured_by].items():
            match = re.fullmatch(rf"{name}_L{line.max_seq_length}_{line.precision}_{line.recompute}_rows(\d+)", key)
            if match:
                assert line.fixed_bytes + int(match[1]) * line.per_row_bytes >= value, key
                checked += 1
    assert checked >= 3 * len(plan)
    planned = {(line.model["num_hidden_layers"], line.max_seq_length, line.precision, line.recompute) for line in plan}
    assert {(24, 512, "bf16", recompute) for recompute in ("none", "attention", "layer")} <= planned
    assert {(layers, length, "fp32", recompute) for layers in (2, 12, 24) for length in (128, 512)
            for recompute in ("none", "attention", "layer")} <= planned
    large = lambda recompute: memory.step_line(LARGE, 512, "bf16", recompute, plan)[1]
    assert large("layer") < large("attention") < large("none")


def test_a_run_on_a_gpu_refuses_a_micro_batch_that_cannot_fit_before_anything_compiles(packed_dir, tmp_path,
                                                                                      monkeypatch):
    """BERT-Large at the test data's L on a card of 16 GB (the override stands in for the GPU):
    one line, exit 2, no output directory."""
    import keras

    monkeypatch.setattr(memory, "device_memory", lambda strategy: (16 * 2**30, "a test card of 16 GB"))
    per_row = memory.step_line(LARGE, MAX_SEQ_LENGTH, "bf16", "none")[1]
    fitting = memory.largest_rows(LARGE, MAX_SEQ_LENGTH, "bf16", "none", 16 * 2**30)
    rows = 2 * fitting  # two micro-batches' worth: half of it fits
    policy = keras.mixed_precision.global_policy().name
    try:
        result = run_command("run_pretraining", f"--bert_config_file={REPO}/configs/bert_config_large.json",
                             f"--input_files={tfrecords(packed_dir)[0]}", f"--output_dir={tmp_path / 'run'}",
                             "--precision=bf16", "--xla", f"--train_batch_size={rows}")
    finally:  # the run set bf16's policy for the whole process
        keras.mixed_precision.set_global_policy(policy)
    assert result.returncode == 2, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"run_pretraining: error: --train_batch_size={rows}: {rows} rows of {MAX_SEQ_LENGTH} a "
                           f"replica need about "), line
    assert f"a test card of 16 GB has 16.0 GiB, less 5% kept free; at most {fitting} rows fit" in line
    assert (f"--train_batch_size={rows // 2} --steps_per_update=2 --num_train_steps=200 keep the {rows} rows an update "
            f"and the 100 updates") in line
    assert per_row > 0 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("content, message", [
    (None, "cannot read it (No such file or directory)"),
    ({"bytes": {"tiny_L128_fp32_none_rows1": "100"}, "measured_by": "x", "device": "H100"},
     "tiny_L128_fp32_none_rows1 is '100' bytes; expected a positive whole number"),
    ({"bytes": {"tiny_L128_fp32_none_rows1": 0}, "measured_by": "x", "device": "H100"}, "is 0 bytes"),
    ({"bytes": {"tiny_L128_fp32_none_rows1": 2**30, "tiny_L128_fp32_none_rows4": 2**29}, "measured_by": "x",
      "device": "H100"}, "tiny at L=128, fp32, recompute none: its bytes do not grow with the rows"),
])
def test_bad_measurements_are_one_line_and_the_plan_is_not_written(tmp_path, content, message):
    """A missing file, bytes as strings or zeros gave tracebacks; bytes falling as rows grow were
    fitted to a negative line and written into the shipped plan (a 16 GB card then held 4,096 rows)."""
    from conftest import run_script

    from bert_packed.training.memory import PLAN_FILE

    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(json.dumps(content))
    plan = open(PLAN_FILE, "rb").read()
    result = run_script("benchmark_memory", f"--measurements={path}", "--write_plan", "--bert_configs=tiny")
    assert result.returncode == 2 and message in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]
    assert open(PLAN_FILE, "rb").read() == plan
