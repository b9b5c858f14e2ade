"""The weights out to where users fine-tune (a Hugging Face directory, a TF1 checkpoint) and back in:
read by the real readers (transformers, keras-hub), not checked by names."""

import json
import logging
import os

import numpy as np
import pytest
from conftest import MAX_SEQ_LENGTH, TINY, VOCAB, run_command, tfrecords
from training_runs import config, make_trainer, trained

from bert_packed.model import (
    BertConfig,
    BertPretrainingModel,
    export_google_checkpoint,
    google_variable_names,
    load_google_checkpoint,
)
from bert_packed.model.huggingface import EXPORT_FILES, load_huggingface
from bert_packed.pretraining_data.tokenization import Tokenizer

# keras-hub's text classifier reads 512 tokens unless told otherwise.
TINY_512 = dict(TINY, max_position_embeddings=512)


def random_model(settings=TINY_512, seed=0, next_sentence_prediction=True) -> BertPretrainingModel:
    """A model whose every weight is drawn at random (a bias or gamma left at its initial value
    would hide a weight put in the wrong place)."""
    model = BertPretrainingModel(BertConfig(**settings), next_sentence_prediction)
    model.build()
    draw = np.random.default_rng(seed)
    for weight in model.weights:
        centre = 1.0 if weight.path.endswith("gamma") else 0.0
        weight.assign((centre + draw.normal(0.0, 0.1, weight.shape)).astype(np.float32))
    return model


def export_through_the_command(model, directory, step):
    """Writes the model's bert_config.json and TF1 checkpoint at `step` into `directory`, and its
    Hugging Face export made from them by export_model, in `directory`/hf.

    Returns:
      (bert_config.json, the checkpoint's prefix, the export).
    """
    bert_config = directory / "bert_config.json"
    bert_config.write_text(json.dumps(model.config.to_dict()))
    prefix = export_google_checkpoint(model, str(directory / f"model.ckpt-{step}"), step)
    result = run_command("export_model", f"--checkpoint={prefix}", f"--bert_config_file={bert_config}",
                         f"--vocab_file={VOCAB}", f"--output_dir={directory / 'hf'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == f"export_model: {prefix} (step {step}) -> {directory / 'hf'} (huggingface)"
    return bert_config, prefix, directory / "hf"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the model, its bert_config.json, its TF1 checkpoint at step 7, its Hugging Face export)."""
    model = random_model()
    return model, *export_through_the_command(model, tmp_path_factory.mktemp("exported"), 7)


def unpacked_inputs(vocab_size, seed=1):
    """Two unpacked sequences, the second padded, two segments each, with masked positions."""
    draw = np.random.default_rng(seed)
    length = 24
    input_ids = draw.integers(5, vocab_size, (2, length)).astype(np.int32)
    input_ids[:, 0] = 2  # [CLS]
    input_mask = np.ones((2, length), np.int32)
    input_mask[1, 15:] = 0
    segment_ids = np.zeros((2, length), np.int32)
    segment_ids[:, 10:] = 1
    return {"input_ids": input_ids * input_mask, "sequence_ids": input_mask, "segment_ids": segment_ids * input_mask,
            "positions": np.tile(np.arange(length, dtype=np.int32), (2, 1)),
            "masked_lm_positions": np.array([[1, 4, 12], [2, 9, 14]], np.int32),
            "next_sentence_positions": np.zeros((2, 1), np.int32)}


def run_transformers(model, features):
    """A transformers BERT's outputs on the unpacked features (unpacked_inputs)."""
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(features["input_ids"], dtype=torch.long),
                     token_type_ids=torch.tensor(features["segment_ids"], dtype=torch.long),
                     attention_mask=torch.tensor(features["sequence_ids"], dtype=torch.long))


@pytest.mark.slow  # loads PyTorch, transformers and keras-hub
def test_transformers_and_keras_hub_read_the_export_and_compute_what_the_model_computes(exported, monkeypatch):
    import keras
    import keras_hub
    import transformers
    from keras_hub.src.models.bert import bert_backbone

    model, _, _, directory = exported
    features = unpacked_inputs(model.config.vocab_size)
    ours = {name: value.numpy() for name, value in model(features).items()}
    sequence_output = model.encoder(features).numpy()
    real = features["sequence_ids"][:, :, None]

    hugging_face = transformers.BertForPreTraining.from_pretrained(str(directory)).eval()
    theirs = run_transformers(hugging_face, features)
    mlm = np.take_along_axis(theirs.prediction_logits.numpy(), features["masked_lm_positions"][:, :, None], axis=1)
    np.testing.assert_allclose(mlm, ours["mlm_logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(theirs.seq_relationship_logits.numpy(), ours["nsp_logits"][:, 0], atol=1e-4, rtol=0)
    tokenizer = Tokenizer(VOCAB)
    text = "The quick brown fox jumps over the lazy dog."
    expected = [tokenizer.cls_id, *tokenizer.encode([text])[0].tolist(), tokenizer.sep_id]
    assert transformers.AutoTokenizer.from_pretrained(str(directory))(text)["input_ids"] == expected

    inputs = {"token_ids": features["input_ids"], "segment_ids": features["segment_ids"],
              "padding_mask": features["sequence_ids"]}
    backbone = keras_hub.models.BertBackbone.from_preset(str(directory))
    # keras-hub's BERT computes GELU by its tanh approximation (google-research/bert's); this model
    # and transformers' "gelu" the exact one: up to about 5e-4 apart at one activation.
    keras_hub_output = backbone(inputs)["sequence_output"].numpy()
    assert np.abs((keras_hub_output - sequence_output) * real).max() < 1e-3
    monkeypatch.setattr(bert_backbone, "gelu_approximate", lambda x: keras.activations.gelu(x, approximate=False))
    exact = keras_hub.models.BertBackbone.from_preset(str(directory))(inputs)["sequence_output"].numpy()
    np.testing.assert_allclose(exact * real, sequence_output * real, atol=1e-5, rtol=0)  # every weight in place

    classifier = keras_hub.models.BertTextClassifier.from_preset(str(directory), num_classes=2)
    assert np.asarray(classifier.preprocessor.tokenizer("the lazy dog")).tolist() == \
        tokenizer.encode(["the lazy dog"])[0].tolist()
    before = [w.numpy() for w in classifier.trainable_weights]
    history = classifier.fit(x=["the quick brown fox", "a lazy dog"], y=np.array([0, 1]), batch_size=2, epochs=1,
                             verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert any(not np.array_equal(a, w.numpy()) for a, w in zip(before, classifier.trainable_weights))


@pytest.fixture(scope="module")
def exported_masked_lm(tmp_path_factory):
    """(a model without the next-sentence head, its Hugging Face export, made from its TF1 checkpoint)."""
    model = random_model(seed=3, next_sentence_prediction=False)
    return model, export_through_the_command(model, tmp_path_factory.mktemp("exported_masked_lm"), 5)[2]


def test_a_model_without_the_next_sentence_head_exports_as_a_masked_lm(exported_masked_lm, tmp_path):
    from safetensors.numpy import load_file

    model, directory = exported_masked_lm
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    names = set(load_file(str(directory / "model.safetensors")))
    assert "cls.predictions.bias" in names and not {n for n in names if "pooler" in n or "seq_relationship" in n}
    loaded = BertPretrainingModel(BertConfig(**TINY_512), next_sentence_prediction=False)
    assert load_huggingface(loaded, str(directory)) == len(google_variable_names(model))
    for mine, theirs in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


@pytest.mark.slow  # loads PyTorch and transformers
def test_transformers_reads_a_masked_lm_export_and_computes_what_the_model_computes(exported_masked_lm):
    import transformers

    model, directory = exported_masked_lm
    features = unpacked_inputs(model.config.vocab_size)
    ours = model(features)
    assert set(ours) == {"mlm_logits"}
    masked_lm = transformers.BertForMaskedLM.from_pretrained(str(directory)).eval()
    theirs = run_transformers(masked_lm, features)
    mlm = np.take_along_axis(theirs.logits.numpy(), features["masked_lm_positions"][:, :, None], axis=1)
    np.testing.assert_allclose(mlm, ours["mlm_logits"].numpy(), atol=1e-4, rtol=0)


def test_the_export_holds_what_transformers_reads_and_every_format_round_trips(exported, tmp_path):
    from safetensors.numpy import load_file

    model, bert_config, prefix, directory = exported
    assert sorted(os.listdir(directory)) == sorted(EXPORT_FILES)
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForPreTraining"]
    assert {name: config[name] for name in TINY_512} == TINY_512
    assert json.loads((directory / "tokenizer_config.json").read_text())["do_lower_case"] is True
    assert (directory / "vocab.txt").read_bytes() == open(VOCAB, "rb").read()
    tensors = load_file(str(directory / "model.safetensors"))
    assert tensors["bert.encoder.layer.0.attention.self.query.weight"].shape == (32, 32)
    np.testing.assert_array_equal(tensors["bert.encoder.layer.0.intermediate.dense.weight"],
                                  model.encoder.encoder_layers[0].intermediate.kernel.numpy().T)  # [out, in]
    np.testing.assert_array_equal(tensors["cls.predictions.bias"], model.masked_lm.output_bias.numpy())
    # Hugging Face -> TF1 (google-research's layout) -> the model: every weight as it was.
    result = run_command("export_model", f"--checkpoint={directory}", f"--bert_config_file={bert_config}",
                         f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'tf1'}", "--format=tf1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "tf1")) == ["bert_config.json", "model.ckpt-0.data-00000-of-00001",
                                                    "model.ckpt-0.index", "vocab.txt"]
    for load, source in ((load_google_checkpoint, str(tmp_path / "tf1" / "model.ckpt-0")),
                         (load_huggingface, str(directory))):
        loaded = BertPretrainingModel(BertConfig(**TINY_512))
        assert load(loaded, source) == len(google_variable_names(model))
        for mine, theirs in zip(loaded.weights, model.weights):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def assert_read_as_init_checkpoint(checkpoint, exported):
    """A run's training checkpoint as --init_checkpoint (it gave a line of 46 problems): pre-training's
    model and a fine-tuning model's encoder read the weights `exported` holds."""
    from bert_packed.model import BertClassifierModel
    from bert_packed.training.checkpoints import load_pretraining_checkpoint

    at_step = BertPretrainingModel(BertConfig(**TINY))
    load_huggingface(at_step, str(exported))
    expected = {name: weight.numpy() for name, weight, _ in google_variable_names(at_step)}
    classifier = BertClassifierModel(BertConfig(**TINY), 2)
    classifier.build()
    for model in (BertPretrainingModel(BertConfig(**TINY)), classifier.encoder):
        assert load_pretraining_checkpoint(model, str(checkpoint)) == str(checkpoint)
        for name, weight, _ in google_variable_names(model):
            np.testing.assert_array_equal(weight.numpy(), expected[name], err_msg=name)
    assert load_pretraining_checkpoint(classifier.encoder, str(exported)) is None  # not a run's


def test_a_run_directory_exports_its_newest_weights(packed_dir, bert_config_file, tmp_path, caplog):
    trainer = make_trainer(config(tmp_path / "run", tfrecords(packed_dir), num_train_steps=2, save_checkpoints_steps=1,
                                  export_huggingface_dir=str(tmp_path / "by_the_run"), vocab_file=VOCAB))
    trainer.train()  # finished: model.ckpt-2 and by_the_run/ exported, checkpoints/ckpt-2

    def export(checkpoint, config_file=bert_config_file, output="hf1", *more):
        return run_command("export_model", f"--checkpoint={checkpoint}", f"--bert_config_file={config_file}",
                           f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / output}", *more)
    # The finished run given a new export directory exports there (once), from its last checkpoint.
    for expected in ("exporting its weights to the new --export_huggingface_dir", "nothing to do"):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            trained(config(tmp_path / "run", tfrecords(packed_dir), num_train_steps=2, save_checkpoints_steps=1,
                           export_huggingface_dir=str(tmp_path / "later"), vocab_file=VOCAB))
        assert f"{tmp_path / 'run'}: finished at step 2; {expected}" in caplog.text
    result = export(tmp_path / "run", bert_config_file, "hf")
    assert result.returncode == 0 and f"{tmp_path / 'run' / 'model.ckpt-2'} (step 2)" in result.stdout, result.stderr
    exported = next((tmp_path / "run").glob("model.ckpt-2.data-*"))
    intact = exported.read_bytes()
    exported.write_bytes(intact[:100])  # a damaged export: the training checkpoint of its step instead
    damaged = export(tmp_path / "run", bert_config_file, "hf")
    assert damaged.returncode == 0 and f"{tmp_path / 'run' / 'checkpoints' / 'ckpt-2'} (step 2)" in damaged.stdout
    assert f"warning: {tmp_path / 'run' / 'model.ckpt-2'}: cannot be read (" in damaged.stderr
    exported.write_bytes(intact)
    os.remove(tmp_path / "run" / "model.ckpt-2.index")  # an unfinished run: its newest training checkpoint
    again = export(tmp_path / "run", bert_config_file, "hf")
    assert again.returncode == 0 and f"{tmp_path / 'run' / 'checkpoints' / 'ckpt-2'} (step 2)" in again.stdout
    for directory in ("hf", "by_the_run", "later"):
        loaded = BertPretrainingModel(BertConfig(**TINY))
        load_huggingface(loaded, str(tmp_path / directory))
        for mine, theirs in zip(loaded.weights, trainer.model.weights):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())

    # One training checkpoint by name; the newest damaged: the one before it, said in one line.
    named = export(tmp_path / "run" / "checkpoints" / "ckpt-1")
    assert named.returncode == 0 and "ckpt-1 (step 1)" in named.stdout, named.stderr[-2000:]
    assert_read_as_init_checkpoint(tmp_path / "run" / "checkpoints" / "ckpt-1", tmp_path / "hf1")
    for file in ("ckpt-1.index", "ckpt-1.data-00000-of-00001"):  # a file of it: the checkpoint it belongs to
        by_file = export(tmp_path / "run" / "checkpoints" / file, bert_config_file, "hf_" + file)
        assert by_file.returncode == 0 and "ckpt-1 (step 1)" in by_file.stdout, by_file.stderr[-2000:]
    data = next((tmp_path / "run" / "checkpoints").glob("ckpt-2.data-*"))
    data.write_bytes(data.read_bytes()[:-64] + bytes(64))
    older = export(tmp_path / "run")
    assert older.returncode == 0 and "ckpt-1 (step 1)" in older.stdout, older.stderr[-2000:]
    warnings = [line for line in older.stderr.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "ckpt-2: cannot be read" in warnings[0] and "trying an older one" in warnings[0]
    # What the weights cannot tell: the run's config says (run.json).
    heads = tmp_path / "heads.json"
    heads.write_text(json.dumps(dict(TINY, num_attention_heads=4)))
    refused = export(tmp_path / "run", heads)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].endswith(
        "the run's num_attention_heads is 2, but --bert_config_file says 4"), refused.stderr[-2000:]
    # A TF1 export over an earlier one holds only the new checkpoint; an export onto its source is refused.
    for checkpoint in (tmp_path / "run" / "checkpoints" / "ckpt-1", tmp_path / "hf1"):
        assert export(checkpoint, bert_config_file, "tf1", "--format=tf1").returncode == 0
    assert sorted(p.name for p in (tmp_path / "tf1").iterdir()) == [
        "bert_config.json", "model.ckpt-0.data-00000-of-00001", "model.ckpt-0.index", "vocab.txt"]
    assert export(tmp_path / "tf1", bert_config_file, "hf2").returncode == 0  # a TF1 export's directory reads
    onto = export(tmp_path / "hf1", bert_config_file, "hf1")
    assert onto.returncode == 2 and "the --checkpoint itself" in onto.stderr


def test_bad_input_to_the_export_is_one_line_and_nothing_half_written_looks_complete(exported, tmp_path,
                                                                                      monkeypatch):
    from bert_packed.storage import files

    _, bert_config, prefix, _ = exported
    common = [f"--checkpoint={prefix}", f"--bert_config_file={bert_config}"]
    other_size = tmp_path / "bert_config_64.json"
    other_size.write_text(json.dumps(dict(TINY_512, hidden_size=64)))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    cases = {
        "another size": ([f"--checkpoint={prefix}", f"--bert_config_file={other_size}", f"--vocab_file={VOCAB}",
                          f"--output_dir={tmp_path / 'a'}"],
                         f"{prefix}: does not fit the model (27 problems): bert/embeddings/word_embeddings has shape "
                         f"[{TINY['vocab_size']}, 32], the model needs [{TINY['vocab_size']}, 64]"),
        "no vocabulary": ([*common, f"--vocab_file={tmp_path / 'missing.txt'}", f"--output_dir={tmp_path / 'b'}"],
                          f"{tmp_path / 'missing.txt'}: vocabulary file not found"),
        "no checkpoint there": ([f"--checkpoint={tmp_path / 'typo'}", f"--bert_config_file={bert_config}",
                                 f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'a'}"],
                                f"{tmp_path / 'typo'}: cannot read the checkpoint"),  # not "fine-tuned weights"
        "a taken directory": ([*common, f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'taken'}"],
                              f"{tmp_path / 'taken'}: holds notes.txt, not an exported model; use an empty or new "
                              f"directory"),
    }
    for name, (args, message) in cases.items():
        result = run_command("export_model", *args)
        assert result.returncode == 2, (name, result.stderr[-3000:])
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"export_model: error: {message}"), (name, last)
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert os.listdir(tmp_path / "taken") == ["notes.txt"]
    # Killed as it writes config.json, the last file: no config.json, so no reader takes it for a
    # model; the same command again completes it.
    write = files.write_text_atomically

    def killed_at_the_config(path, text):
        if path.endswith("config.json") and not path.endswith("tokenizer_config.json"):
            raise KeyboardInterrupt
        write(path, text)

    monkeypatch.setattr(files, "write_text_atomically", killed_at_the_config)
    out = tmp_path / "killed"
    interrupted = run_command("export_model", *common, f"--vocab_file={VOCAB}", f"--output_dir={out}")
    assert interrupted.returncode == 130
    assert "config.json" not in os.listdir(out)
    monkeypatch.setattr(files, "write_text_atomically", write)
    completed = run_command("export_model", *common, f"--vocab_file={VOCAB}", f"--output_dir={out}")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert sorted(os.listdir(out)) == sorted(EXPORT_FILES)


def test_a_hugging_face_tensor_the_model_does_not_have_is_refused_naming_it(tmp_path):
    """Tied copies equal to what they copy and the old position_ids buffer are nothing lost;
    any other tensor left unread would be, and is named."""
    from safetensors.numpy import load_file, save_file

    from bert_packed.model import export_huggingface
    from bert_packed.model.checkpoint import CheckpointError

    source = random_model(TINY, seed=3)
    directory = tmp_path / "hf"
    export_huggingface(source, str(directory), VOCAB, True)
    weights_file = directory / "model.safetensors"
    tensors = load_file(str(weights_file))
    embeddings = tensors["bert.embeddings.word_embeddings.weight"]
    cases = [({"cls.predictions.decoder.weight": embeddings, "bert.embeddings.position_ids": np.arange(128)[None]},
              None),
             ({"cls.predictions.decoder.weight": embeddings + 1}, "cls.predictions.decoder.weight"),
             ({"classifier.weight": np.zeros((2, 32), np.float32), "classifier.bias": np.zeros(2, np.float32)},
              "classifier.bias, classifier.weight")]
    for extra, named in cases:
        save_file({**tensors, **extra}, str(weights_file), metadata={"format": "pt"})
        loaded = BertPretrainingModel(BertConfig(**TINY))
        if named is None:
            assert load_huggingface(loaded, str(directory)) == len(tensors)
            for mine, theirs in zip(loaded.weights, source.weights):
                np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
            continue
        with pytest.raises(CheckpointError) as refused:
            load_huggingface(loaded, str(directory))
        tensors_word = "tensor" if len(extra) == 1 else "tensors"  # "1 tensors" was said
        assert str(refused.value) == (f"{weights_file}: holds {len(extra)} {tensors_word} the model does not have ({named}): "
                                      f"another model's weights; give a BertForPreTraining or BertForMaskedLM "
                                      f"directory")


def test_init_checkpoint_takes_a_hugging_face_directory(packed_dir, unpacked_dir, exported, tmp_path):
    """Continuing pre-training from published weights: the config is checked against
    --bert_config_file, and the packed and the unpacked run start from the same loss."""
    from bert_packed.errors import UserError

    source = random_model(TINY, seed=3)
    directory = tmp_path / "hf"
    from bert_packed.model import export_huggingface

    export_huggingface(source, str(directory), VOCAB, True)
    losses = []
    for name, files, eval_packed in (("packed", packed_dir, True), ("unpacked", unpacked_dir, False)):
        trainer = make_trainer(config(tmp_path / name, tfrecords(packed_dir), init_checkpoint=str(directory),
                                      eval_files=tuple(tfrecords(files)), eval_packed=eval_packed))
        losses.append(trainer.evaluate_only())
    assert losses[0]["num_sequences"] == losses[1]["num_sequences"] == 122
    assert losses[0]["loss"] == pytest.approx(losses[1]["loss"], rel=1e-5)
    # A directory of another shape: refused at start, naming the first setting that differs.
    _, _, _, wide = exported
    with pytest.raises(UserError, match=rf"^{wide}/config.json: max_position_embeddings=512, but "
                                        rf"--bert_config_file says max_position_embeddings={MAX_SEQ_LENGTH}$"):
        trained(config(tmp_path / "wide", tfrecords(packed_dir), init_checkpoint=str(wide)))


def test_a_run_that_ends_with_an_export_refuses_at_start_what_the_export_would(tmp_path):
    from bert_packed.model.checkpoint import CheckpointError
    from bert_packed.model.huggingface import require_export_directory

    bert = BertConfig(**TINY)
    run = tmp_path / "run"
    big = tmp_path / "big_vocab.txt"
    big.write_text(open(VOCAB).read() + "".join(f"extra{i}\n" for i in range(TINY["vocab_size"])))
    (tmp_path / "a file").write_text("x")
    cases = {str(run / "hf"): "in the run's --output_dir; export to a directory of its own",
             str(tmp_path / "a file" / "hf"): f"under {tmp_path / 'a file'}, a file, not a directory"}
    for output, message in cases.items():
        with pytest.raises(CheckpointError, match=f"^{output}: {message}$"):
            require_export_directory(output, VOCAB, True, bert, str(run))
    with pytest.raises(CheckpointError, match=rf"{TINY['vocab_size'] * 2:,} tokens, but the model's vocab_size is "):
        require_export_directory(str(tmp_path / "hf"), str(big), True, bert, str(run))
    require_export_directory(str(tmp_path / "hf"), VOCAB, True, bert, str(run))  # a directory of its own: fine


@pytest.mark.parametrize("retry_may_help", [True, False])
def test_an_export_directory_out_of_reach_keeps_its_retryable_status(tmp_path, monkeypatch, retry_may_help):
    """A bucket out of reach now is a StorageError the same command again gets past (exit 75);
    a directory the storage refuses is the setting's problem (exit 2)."""
    from bert_packed.errors import StorageError
    from bert_packed.model.checkpoint import CheckpointError
    from bert_packed.model.huggingface import require_export_directory
    from bert_packed.storage import files

    def out_of_reach(path):
        raise StorageError(path, "deadline exceeded" if retry_may_help else "permission denied", retry_may_help)

    monkeypatch.setattr(files, "makedirs", out_of_reach)
    expected = StorageError if retry_may_help else CheckpointError
    with pytest.raises(expected, match="deadline exceeded" if retry_may_help else "--export_huggingface_dir: .*permission"):
        require_export_directory(str(tmp_path / "hf"), VOCAB, True, BertConfig(**TINY), str(tmp_path / "run"))


def test_a_fine_tuned_model_s_weights_start_another_task_and_a_training_checkpoint_is_named(tmp_path):
    """A fine-tuned classifier's weights (TF1 or Hugging Face, without the pre-training heads) as
    run_squad's --init_checkpoint failed on heads the span model does not train; a run's
    checkpoints/ckpt-N gave a line of 46 problems."""
    import tensorflow as tf

    from bert_packed.model import BertClassifierModel, BertQuestionAnsweringModel, export_huggingface, load_weights
    from bert_packed.model.checkpoint import CheckpointError

    def encoder(model):
        return [w.numpy() for w in model.weights if "/layer_" in w.path or "/embeddings/" in w.path]

    classifier = BertClassifierModel(BertConfig(**TINY_512), 2)
    classifier.build()
    classifier.encoder.set_weights(random_model(seed=4).encoder.get_weights())
    tf1 = export_google_checkpoint(classifier, str(tmp_path / "tf1" / "model.ckpt-7"), 7)
    hf = export_huggingface(classifier, str(tmp_path / "hf"), VOCAB, True, labels=("a", "b"))
    for path in (tf1, hf):
        span = BertQuestionAnsweringModel(BertConfig(**TINY_512))
        span.build()
        load_weights(span.encoder, path)
        for mine, theirs in zip(encoder(span.encoder), encoder(classifier.encoder), strict=True):
            np.testing.assert_array_equal(mine, theirs, err_msg=path)
    with pytest.raises(CheckpointError, match="does not fit the model"):  # a pre-training model needs its heads
        load_weights(BertPretrainingModel(BertConfig(**TINY_512)), tf1)
    tf.train.Checkpoint(model=random_model(seed=5)).write(str(tmp_path / "run" / "ckpt-9"))  # as a run saves
    with pytest.raises(CheckpointError, match=r"ckpt-9: a run's training checkpoint \(it resumes that run\); give the "
                                              r"run's exported model.ckpt-N"):
        load_weights(BertPretrainingModel(BertConfig(**TINY_512)), str(tmp_path / "run" / "ckpt-9"))


def test_an_encoder_alone_exports_as_a_bert_model_and_loads_back(tmp_path):
    """A BertEncoder (the backbone a notebook builds alone) exports as transformers' BertModel,
    with or without its pooler, and reads back weight for weight."""
    import json

    from bert_packed.model import BertEncoder, export_huggingface, load_weights

    for with_pooler in (True, False):
        encoder = BertEncoder(BertConfig(**TINY), with_pooler=with_pooler)
        encoder.build()
        directory = export_huggingface(encoder, str(tmp_path / str(with_pooler)), VOCAB, True)
        assert json.loads((tmp_path / str(with_pooler) / "config.json").read_text())["architectures"] == ["BertModel"]
        again = BertEncoder(BertConfig(**TINY), with_pooler=with_pooler)
        again.build()
        assert load_weights(again, directory) == len(encoder.weights) + 4 * TINY["num_hidden_layers"]  # q, k, v apart
        for mine, theirs in zip(again.weights, encoder.weights, strict=True):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
