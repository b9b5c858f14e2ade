"""TensorFlow's whole update exported and run by JAX's XLA (bert_packed.update_program): the update
is the trainer's, the route is faithful on this CPU before any GPU sees it, and a broken export is
one line."""

import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest
from conftest import MAX_PREDICTIONS, MAX_SEQ_LENGTH, MAX_SEQUENCES_PER_PACK, TINY, run_script

from bert_packed.update_program import export
from bert_packed.update_program.export import ExportError, Layout, Parameter

# The export the route is tested on: both layouts of the tiny config in fp32, each held against
# TensorFlow and against each other; bf16; a fine-tuning classifier (AdamW), another model. The
# mini config (the device's correctness check) is the same route on a larger model: a fifth of the
# export's and the check's time here, for nothing the tiny configs do not test.
CONFIGURATIONS = ("tiny_L512_fp32_packed", "tiny_L512_fp32_padded", "tiny_L512_bf16_packed",
                  "tiny_classifier_L128_fp32_packed")


@pytest.mark.slow  # compiles the trainer's update and the one-program update of a tiny model, twice (over 3.5 s)
@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_one_update_is_the_trainers_update_with_xla(optimizer, tmp_path):
    import tensorflow as tf

    from bert_packed.features import Shapes
    from bert_packed.model import BertConfig
    from bert_packed.training.config import make_config
    from bert_packed.training.data import TrainData
    from bert_packed.training.doctor import same_sequences_packed_or_not
    from bert_packed.training.process import set_up_process
    from bert_packed.training.step import CompiledStep

    shapes = Shapes(MAX_SEQ_LENGTH, MAX_PREDICTIONS, MAX_SEQUENCES_PER_PACK)
    config = make_config(bert=BertConfig(**TINY), xla=True, input_mode="packed", train_batch_size=2, optimizer=optimizer,
                         learning_rate=1e-3, num_train_steps=100, output_dir=str(tmp_path))
    set_up_process(config)
    step = CompiledStep(config, TrainData(shapes=shapes, input_mode="packed", packing_factor=3.0))
    packed, _ = same_sequences_packed_or_not(shapes, 6, TINY["vocab_size"])
    start = step.initial_state()
    trainer = step.run_updates(iter(tf.data.Dataset.from_tensors(packed).repeat()), 1)[0]
    by_trainer = [v.numpy() for v in [*step.model.variables, *step.optimizer.variables]]
    step.reset(start)
    outputs = step.update.one_update(packed, step.update.dropout_seeds(0, 1))  # dropout on: the same masks
    by_one_program = [v.numpy() for v in [*step.model.variables, *step.optimizer.variables]]
    assert [float(outputs[k]) for k in ("learning_rate", *step.update.sum_keys)] == pytest.approx(trainer, rel=1e-6)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(by_trainer, start))
    assert moved > 1e-4  # the update did something
    for ours, theirs in zip(by_one_program, by_trainer):
        assert np.abs(ours.astype(np.float64) - theirs).max() <= 1e-6 * max(1.0, np.abs(theirs).max())


@pytest.fixture(scope="module")
def exported(corpus, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("export") / "export")
    result = run_script("export_update_programs", f"--output_dir={directory}", f"--corpus={','.join(corpus)}",
                        f"--configurations={','.join(CONFIGURATIONS)}")
    assert result.returncode == 0, result.stderr
    return directory


@pytest.fixture(scope="module")
def checked(exported, tmp_path_factory):
    """The device check of the export on this CPU, and its JSON."""
    output = str(tmp_path_factory.mktemp("check") / "xla.json")
    result = run_script("device_check_xla", f"--export_dir={exported}", f"--output_json={output}", "--calls=2",
                        "--warmup=1", "--workers=2")
    with open(output) as f:
        return result, json.load(f)


@pytest.mark.slow  # exports five programs with TensorFlow and runs them through JAX (about two minutes)
def test_the_export_holds_what_its_manifest_says(exported):
    made_by, configurations = export.read_manifest(exported)
    assert set(configurations) == set(CONFIGURATIONS) and made_by["seed"] == 1
    packed, padded = configurations["tiny_L512_fp32_packed"], configurations["tiny_L512_fp32_padded"]
    assert packed.partner == padded.name and padded.layout == "padded" and padded.rows == padded.sequences
    assert packed.sequences == padded.sequences > packed.rows  # the same sequences, several a pack
    assert packed.real_tokens == padded.real_tokens and packed.fp32_products == "highest"
    features, slots = export.read_batch(exported, packed)
    assert features["input_ids"].shape == (packed.rows, 512) and slots.shape == (packed.rows, 3)
    assert sorted(slots[slots >= 0]) == sorted(export.read_batch(exported, padded)[1][:, 0])
    _, layout = export.read_program(exported, packed, "update")
    _, padded_layout = export.read_program(exported, padded, "update")
    weights = [p.name for p in layout.parameters if p.role == "weight"]
    assert weights == [p.name for p in padded_layout.parameters if p.role == "weight"]  # drawn alike
    _, classifier = export.read_program(exported, configurations["tiny_classifier_L128_fp32_packed"], "update")
    assert "classifier/kernel" in [p.name for p in classifier.parameters]  # another model built
    assert "classifier/kernel" not in weights and "encoder/layer_0/output/kernel" in weights
    roles = [p.role for p in layout.parameters]
    assert roles.count("weight") == roles.count("slot") // 2 > 0 and roles.count("iteration") == 1
    assert all(p.output is not None for p in layout.parameters if p.role in ("weight", "slot", "iteration"))
    assert all(p.output is None for p in layout.parameters if p.role in ("feature", "schedule", "argument"))
    size = sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(exported) for name in names)
    assert size < 4 * 2**20


@pytest.mark.slow  # see test_the_export_holds_what_its_manifest_says
def test_jax_runs_the_export_as_tensorflow_ran_it(checked):
    result, report = checked
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no accelerator: JAX sees only the CPU" in result.stdout
    assert report["made_how"].startswith("TensorFlow 2.21") and "input pipeline not included" in report["made_how"]
    for name in CONFIGURATIONS:
        figures = report["configurations"][name]
        assert figures["check"]["passed"], figures["check"]
        assert figures["memory"]["aliased"] > 0 and figures["memory"]["compiled"] > figures["memory"]["aliased"]
        assert figures["rates"]["sequences_per_second"] > 0 and len(figures["time"]["seconds"]) == 2
        if "fp32" in name:  # full-precision products: TensorFlow's own outputs to 1e-5
            check = figures["check"]
            assert max(check["slot_losses"], check["outputs"], check["state"]) <= 1e-5, check
            assert check["elements"] <= 1e-3, check
    pair = report["pairs"]["tiny_L512_fp32_packed"]
    assert pair["passed"] and pair["sequence_losses"] <= 1e-5 and pair["sequences_compared"] >= 3
    assert pair["speedup_real_tokens_per_second"] > 0
    peer = report["peer"]  # transformers' BertForPreTraining on the same padded sequences, here on the CPU
    assert peer["configuration"] == "tiny_L512_fp32_padded" and peer["sequences_per_second"] > 0
    assert peer["ours_padded_over_peer"] > 0 and peer["ours_packed_over_peer"] > 0
    assert "every check passed" in result.stdout and "| tiny_L512_fp32_packed | 2 |" in result.stdout


@pytest.mark.slow  # see test_the_export_holds_what_its_manifest_says
def test_a_broken_export_is_one_line_and_the_rest_goes_on(exported, tmp_path):
    copy = str(tmp_path / "export")
    shutil.copytree(exported, copy)
    program = os.path.join(copy, "tiny_L512_fp32_padded", "update.hlo.pb.xz")
    with open(program, "r+b") as f:  # a copy cut short
        f.truncate(os.path.getsize(program) // 2)
    os.remove(os.path.join(copy, "tiny_L512_bf16_packed", "batch.npz"))
    result = run_script("device_check_xla", f"--export_dir={copy}", "--calls=1", "--warmup=0", "--workers=2",
                        "--configurations=tiny_L512_fp32_packed,tiny_L512_fp32_padded,tiny_L512_bf16_packed")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "\npeer: no padded pre-training configuration was timed\n" in result.stdout  # was a KeyError
    assert f"tiny_L512_fp32_padded: {program}: " in result.stdout and "partial or changed" in result.stdout
    assert "tiny_L512_bf16_packed/batch.npz: missing" in result.stdout
    assert "| tiny_L512_fp32_packed | 2 |" in result.stdout and "2 configuration(s) not run" in result.stdout
    result = run_script("device_check_xla", f"--export_dir={copy}", f"--output_json={tmp_path}")
    assert result.returncode == 2 and "a directory; expected a file's path" in result.stderr
    os.remove(os.path.join(copy, "manifest.json"))
    result = run_script("device_check_xla", f"--export_dir={copy}")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "no manifest.json; expected what scripts/export_update_programs.py writes" in result.stderr


def test_a_program_that_is_not_its_layout_is_named(tmp_path):
    import jax

    serialized = jax.jit(lambda x, y: (x + 1.0, y * 2)).lower(np.zeros((2, 3), np.float32), np.int32(1)).compiler_ir(
        "hlo").as_serialized_hlo_module_proto()
    from bert_packed.update_program.run import check_program

    parameters = (Parameter("weight", "w", (2, 3), "float32", "normal"), Parameter("argument", "n", (), "int32", value=1))
    layout = Layout(parameters, ("w", "n"))
    check_program(serialized, layout, "p.hlo.pb.xz")  # as it is: no complaint
    wrong_shape = Layout((dataclasses.replace(parameters[0], shape=(3, 2)), parameters[1]), layout.outputs)
    with pytest.raises(ExportError, match=r"p.hlo.pb.xz: parameter 0 \(w\) is .* float32\[3, 2\] in its layout"):
        check_program(serialized, wrong_shape, "p.hlo.pb.xz")
    written = Layout((dataclasses.replace(parameters[0], output=0), parameters[1]), layout.outputs)
    with pytest.raises(ExportError, match="writes 0 parameters in place, its layout 1"):
        check_program(serialized, written, "p.hlo.pb.xz")
    with pytest.raises(ExportError, match="takes 2 parameters, its layout lists 1"):
        check_program(serialized, Layout(parameters[:1], ("w",)), "p.hlo.pb.xz")


def test_both_sides_draw_the_same_starting_weights_and_summaries_see_a_changed_element():
    layout = Layout((Parameter("feature", "input_ids", (1, 4), "int32"),
                     Parameter("weight", "layer/kernel", (64, 32), "float32", "normal", output=1),
                     Parameter("weight", "layer/LayerNorm/gamma", (32,), "float32", "ones", output=2),
                     Parameter("slot", "lamb/layer_kernel_m", (64, 32), "float32", output=3),
                     Parameter("schedule", "schedule/init_lr", (), "float32", value=4.25e-4)), ("loss", "w", "g", "m"))
    values = export.initial_values(layout, {"input_ids": np.arange(4).reshape(1, 4)}, seed=7)
    again = export.initial_values(layout, {"input_ids": np.arange(4).reshape(1, 4)}, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(values, again))
    kernel = values[1]
    assert kernel.dtype == np.float32 and abs(kernel.std() - 0.02) < 0.002 and (values[2] == 1).all()
    assert (values[3] == 0).all() and values[4] == np.float32(4.25e-4)
    assert not np.array_equal(kernel, export.initial_values(layout, {"input_ids": values[0]}, seed=8)[1])
    summary = export.summary("layer/kernel", kernel)
    assert export.summary_difference(summary, summary, kernel.size) == (0.0, 0.0)
    changed = kernel.copy().reshape(-1)
    changed[export.sample_indices("layer/kernel", kernel.size)[0]] += 0.002  # a tenth of the root mean square
    whole, elements = export.summary_difference(export.summary("layer/kernel", changed), summary, kernel.size)
    assert whole < 1e-3 and elements == pytest.approx(0.1, rel=0.05)


def described(name="a", **changed):
    """A manifest entry as the exporter writes it, with `changed`."""
    entry = dataclasses.asdict(export.Configuration(
        name=name, model="tiny", bert={}, objective="pretraining", layout="packed", precision="fp32",
        fp32_products="highest", max_seq_length=512, rows=2, sequences=5, real_tokens=1024, predictions=40,
        flops=1e9, planned_bytes=None, sized_for=None, checked=False, partner=None, seed=1,
        files={file: {"bytes": 1, "sha256": "0"} for file in ("update.hlo.pb.xz", "update.json", "batch.npz")}))
    return {**entry, **changed}


@pytest.mark.parametrize("changed, message", [
    ({"flops": "many"}, "a's flops is 'many', not what the exporter writes"),
    ({"rows": "two"}, "a's rows is 'two'"),
    ({"checked": "no"}, "a's checked is 'no'"),
    ({"layout": "diagonal"}, "a's layout is 'diagonal'; expected one of packed, padded"),
    ({"files": {}}, "a lists no batch.npz; export the configuration again"),
    ({"files": {"update.json": {"bytes": "1"}}}, "a's file 'update.json' is recorded as"),
    ({"name": "b"}, "a is described as 'b'"),
    ({"unknown_key": 1}, "a is not described as the exporter writes it"),
])
def test_a_manifest_edited_by_hand_is_named_in_one_line(tmp_path, changed, message):
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "configurations": {
        "a": described(**changed), "ok": described("ok")}}))
    with pytest.raises(ExportError, match=re.escape(message)):
        export.read_manifest(str(tmp_path))
    assert set(export.read_manifest(str(tmp_path), drop_broken=True)[1]) == {"ok"}  # the exporter writes it again


def test_a_manifest_that_is_not_an_export_is_named(tmp_path):
    with pytest.raises(ExportError, match="no manifest.json"):
        export.read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 99, "configurations": {}}))
    with pytest.raises(ExportError, match="format_version 99, expected 1"):
        export.read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "made_by": [1], "configurations": {}}))
    with pytest.raises(ExportError, match="made_by or configurations is not an object"):
        export.read_manifest(str(tmp_path))


def test_a_batch_that_is_not_the_programs_is_named():
    layout = Layout((Parameter("feature", "input_ids", (2, 8), "int32"), Parameter("feature", "positions", (2, 8), "int32")),
                    ("loss",))
    batch = {"input_ids": np.zeros((2, 8), np.int32), "positions": np.zeros((2, 8), np.int32)}
    export.check_batch(batch, layout, "b.npz")
    with pytest.raises(ExportError, match=r"b.npz: no feature 'positions', which the program takes"):
        export.check_batch({"input_ids": batch["input_ids"]}, layout, "b.npz")
    with pytest.raises(ExportError, match=r"b.npz: input_ids is float64\[2, 8\], the program takes int32\[2, 8\]"):
        export.check_batch({**batch, "input_ids": np.zeros((2, 8))}, layout, "b.npz")


def test_the_export_command_refuses_an_unknown_configuration_and_another_export(tmp_path, corpus):
    result = run_script("export_update_programs", f"--output_dir={tmp_path}", "--configurations=huge_L512_fp32_packed")
    assert result.returncode == 2 and "no configuration 'huge_L512_fp32_packed'; expected some of" in result.stderr
    result = run_script("export_update_programs", f"--output_dir={tmp_path}", "--configurations=")
    assert result.returncode == 2 and "--configurations is empty" in result.stderr
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 1, "made_by": {"seed": 5}, "configurations": {}}))
    result = run_script("export_update_programs", f"--output_dir={tmp_path}", f"--corpus={corpus[0]}",
                        "--configurations=tiny_L512_fp32_packed")
    assert result.returncode == 2 and "holds an export of other inputs" in result.stderr


def test_an_output_json_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    """Every command writing --output_json at its end (cli.common.run) tries its place first: the
    device check and the benchmarks refused one only after all their measurements."""
    (tmp_path / "a_file").write_text("")
    for command, args in (("device_check_xla", ["--export_dir=nowhere"]), ("benchmark_finetuning", ["--rounds=1"])):
        result = run_script(command, *args, f"--output_json={tmp_path}")
        assert result.returncode == 2 and "--output_json=" in result.stderr and "a directory" in result.stderr
        result = run_script(command, *args, f"--output_json={tmp_path / 'a_file' / 'out.json'}")
        assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
        assert "--output_json" in result.stderr and not result.stdout.strip(), result.stdout
