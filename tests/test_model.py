"""Packed BERT: the same sequences give the same outputs, losses and gradients packed or not."""

import dataclasses
import json
import re

import numpy as np
import pytest
import tensorflow as tf

from bert_packed.features import Shapes, model_features
from bert_packed.model import (
    BertConfig,
    BertPretrainingModel,
    CheckpointError,
    ConfigError,
    export_google_checkpoint,
    google_variable_names,
    load_google_checkpoint,
)
from bert_packed.packing import packer
from bert_packed.training import loss_from_sums, metrics_from_sums, pretraining_sums

CONFIG = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1,
                    attention_probs_dropout_prob=0.1)
L, P, S = 32, 6, 3


def make_sequences(count, seed=0):
    """Random sequences as packer rows: [CLS]=1 first, lengths 4..14, 1..P predictions."""
    rng = np.random.default_rng(seed)
    rows = np.zeros(count, dtype=packer.row_dtype(Shapes(L, P)))
    rows["length"] = rng.integers(4, 15, count)
    rows["num_predictions"] = np.minimum(rows["length"] - 1, rng.integers(1, P + 1, count))
    rows["num_predictions"][1] = 1
    rows["next_sentence_label"] = rng.integers(0, 2, count)
    for i, row in enumerate(rows):
        n, p = int(row["length"]), int(row["num_predictions"])
        rows["input_ids"][i, :n] = rng.integers(5, CONFIG.vocab_size, n)
        rows["input_ids"][i, 0] = 1
        rows["segment_ids"][i, n // 2:n] = 1
        rows["masked_lm_positions"][i, :p] = np.sort(rng.choice(np.arange(1, n), p, replace=False))
        rows["masked_lm_ids"][i, :p] = rng.integers(5, CONFIG.vocab_size, p)
    return rows


def layouts(rows):
    """(unpacked features, packed features, [(pack, position)] of each sequence); the features as the
    model reads them (features.model_features of the packer's packs)."""
    one_per_row = packer.assemble_packs(rows, np.arange(len(rows)), np.zeros(len(rows), int), len(rows), Shapes(L, P))
    pack_of_row, position, used, fill, predictions = [], [], [], [], []
    for length, count in zip(rows["length"], rows["num_predictions"]):  # first fit within L, S and P + S
        for p in range(len(used)):
            if fill[p] + length <= L and used[p] < S and predictions[p] + count <= P + S:
                break
        else:
            p = len(used)
            used.append(0)
            fill.append(0)
            predictions.append(0)
        pack_of_row.append(p)
        position.append(used[p])
        used[p] += 1
        fill[p] += length
        predictions[p] += count
    packed = packer.assemble_packs(rows, np.array(pack_of_row), np.array(position), len(used), Shapes(L, P, S))
    as_tensors = lambda packs: {k: tf.constant(v) for k, v in model_features(packs).items()}
    return as_tensors(one_per_row), as_tensors(packed), list(zip(pack_of_row, position))


@pytest.fixture(scope="module")
def model():
    keras_model = BertPretrainingModel(CONFIG)
    keras_model.build()
    return keras_model


@pytest.fixture(scope="module")
def data():
    rows = make_sequences(12)
    return rows, *layouts(rows)


def per_sequence_outputs(outputs, features, where):
    """For each sequence: (its MLM logits [p, V], its NSP logits [2])."""
    mlm, nsp = outputs["mlm_logits"].numpy(), outputs["nsp_logits"].numpy()
    sequence_of_prediction = features["prediction_sequence_ids"].numpy()
    return [(mlm[p][sequence_of_prediction[p] == k + 1], nsp[p, k]) for p, k in where]


def test_packed_rows_hold_several_sequences(data):
    rows, unpacked, packed, where = data
    assert packed["input_ids"].shape[0] < unpacked["input_ids"].shape[0] == 12
    assert max(k for _, k in where) == S - 1


def test_same_per_sequence_logits_packed_or_not(model, data):
    rows, unpacked, packed, where = data
    alone = per_sequence_outputs(model(unpacked), unpacked, [(i, 0) for i in range(len(rows))])
    together = per_sequence_outputs(model(packed), packed, where)
    for (mlm_a, nsp_a), (mlm_b, nsp_b), row in zip(alone, together, rows):
        assert mlm_a.shape == (row["num_predictions"], CONFIG.vocab_size)
        np.testing.assert_allclose(mlm_a, mlm_b, atol=1e-5)
        np.testing.assert_allclose(nsp_a, nsp_b, atol=1e-5)


@pytest.mark.parametrize("loss_averaging", ["token", "sequence"])
def test_same_loss_and_gradients_packed_or_not(model, data, loss_averaging):
    _, unpacked, packed, _ = data

    def loss_and_gradients(features):
        with tf.GradientTape() as tape:
            loss = loss_from_sums(pretraining_sums(model(features), features), loss_averaging)
        return loss, tape.gradient(loss, model.trainable_variables)

    loss_a, grads_a = loss_and_gradients(unpacked)
    loss_b, grads_b = loss_and_gradients(packed)
    np.testing.assert_allclose(loss_a.numpy(), loss_b.numpy(), rtol=1e-6)
    assert len(grads_a) == len(model.trainable_variables) and all(g is not None for g in grads_a)
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(), atol=1e-5)


def test_sums_add_up_across_micro_batches(model, data):
    """Summing sums over two halves and dividing once equals the whole batch; so do the halves'
    losses divided by the normalizers of the whole batch (how the trainer accumulates)."""
    from bert_packed.training.losses import normalizers

    _, _, packed, _ = data
    halves = [{k: v[:3] for k, v in packed.items()}, {k: v[3:] for k, v in packed.items()}]
    whole = pretraining_sums(model(packed), packed)
    parts = [pretraining_sums(model(h), h) for h in halves]
    added = {k: parts[0][k] + parts[1][k] for k in whole}
    counts = {k: normalizers(halves[0])[k] + normalizers(halves[1])[k] for k in normalizers(packed)}
    for name, value in normalizers(packed).items():
        assert float(value) == float(whole[name]) == float(counts[name])
    for averaging in ("token", "sequence"):
        expected = loss_from_sums(whole, averaging)
        np.testing.assert_allclose(loss_from_sums(added, averaging), expected, rtol=1e-6)
        split = sum(loss_from_sums(part, averaging, counts) for part in parts)
        np.testing.assert_allclose(split, expected, rtol=1e-6)


def test_losses_match_an_independent_numpy_computation(model, data):
    rows, unpacked, packed, where = data
    outputs = model(packed)
    per_sequence = per_sequence_outputs(outputs, packed, where)

    def nll(logits, label):
        logits = logits - logits.max()
        return np.log(np.exp(logits).sum()) - logits[label]

    token_nll, sequence_means, correct = [], [], []
    for (mlm, _nsp), row in zip(per_sequence, rows):
        labels = row["masked_lm_ids"][:row["num_predictions"]]
        values = [nll(logit, label) for logit, label in zip(mlm, labels)]
        token_nll += values
        sequence_means.append(np.mean(values))
        correct += list(mlm.argmax(-1) == labels)
    nsp = np.mean([nll(nsp, row["next_sentence_label"]) for (_, nsp), row in zip(per_sequence, rows)])
    metrics_token = metrics_from_sums(pretraining_sums(outputs, packed), "token")
    metrics_sequence = metrics_from_sums(pretraining_sums(outputs, packed), "sequence")
    assert metrics_token["mlm_loss"] == pytest.approx(np.mean(token_nll), rel=1e-5)
    assert metrics_sequence["mlm_loss"] == pytest.approx(np.mean(sequence_means), rel=1e-5)
    assert metrics_token["nsp_loss"] == pytest.approx(nsp, rel=1e-5)
    assert metrics_token["loss"] == pytest.approx(np.mean(token_nll) + nsp, rel=1e-5)
    assert metrics_token["mlm_accuracy"] == pytest.approx(np.mean(correct))
    assert metrics_token["num_sequences"] == len(rows)


def test_empty_packs_and_sequences_without_predictions_give_no_nan(model, data):
    _, _, packed, _ = data
    empty = {k: tf.zeros_like(v) for k, v in packed.items()}
    sums = pretraining_sums(model(empty), empty)
    assert float(loss_from_sums(sums, "token")) == 0.0 and float(loss_from_sums(sums, "sequence")) == 0.0
    no_predictions = dict(packed, prediction_sequence_ids=tf.zeros_like(packed["prediction_sequence_ids"]))
    metrics = metrics_from_sums(pretraining_sums(model(no_predictions), no_predictions), "sequence")
    assert np.isfinite(list(metrics.values())).all() and metrics["mlm_loss"] == 0.0


def test_no_attention_crosses_sequences(model, data):
    _, _, packed, where = data
    pack = next(p for p, k in where if k == 1)  # a pack with at least two sequences
    mask = packed["sequence_ids"].numpy()[pack]
    changed = {k: v.numpy().copy() for k, v in packed.items()}
    second = mask == 2
    changed["input_ids"][pack][second] = (changed["input_ids"][pack][second] + 7) % CONFIG.vocab_size
    before = model.encoder(packed).numpy()[pack]
    after = model.encoder({k: tf.constant(v) for k, v in changed.items()}).numpy()[pack]
    np.testing.assert_allclose(before[mask != 2], after[mask != 2], atol=1e-6)
    assert np.abs(before[second] - after[second]).max() > 1e-3


def test_dropout_is_active_only_in_training_and_its_masks_follow_the_seed(model, data):
    _, unpacked, _, _ = data
    nsp = lambda **kwargs: model(unpacked, **kwargs)["nsp_logits"].numpy()
    a, b = nsp(training=True, dropout_seed=tf.constant([1, 2])), nsp(training=True, dropout_seed=tf.constant([1, 3]))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, nsp(training=True, dropout_seed=tf.constant([1, 2])))
    assert not np.allclose(nsp(training=True), nsp(training=True))  # no seed: a random one each call
    np.testing.assert_array_equal(nsp(), nsp())


def test_stateless_dropout_drops_at_its_rate_and_keeps_the_expectation():
    from bert_packed.model.modeling import dropout

    x = tf.ones([200, 500])
    dropped = dropout(x, 0.1, tf.constant([7, 8])).numpy()
    assert set(np.unique(dropped)) == {0.0, np.float32(1 / 0.9)}
    assert (dropped == 0).mean() == pytest.approx(0.1, abs=0.003)
    assert dropped.mean() == pytest.approx(1.0, abs=0.005)
    np.testing.assert_array_equal(dropout(x, 0.0, tf.constant([7, 8])).numpy(), x.numpy())


@pytest.mark.slow  # gradients of three models, packed and unpacked (over 3.5 s here)
def test_recompute_gives_the_same_loss_and_gradients_with_dropout_on(data):
    """What the backward pass recomputes (the attention block, the whole layer) draws the same
    dropout masks as the forward pass, so the gradients are those of keeping it: packed and
    unpacked, in float32, to 1e-6 (measured: equal). One layer: each runs the same code. Under
    XLA (3e-8 for a whole layer, measured), scripts/device_check.py holds it to the same bound
    (tests/test_doctor.py runs it)."""
    _, unpacked, packed, _ = data
    one_layer = dataclasses.replace(CONFIG, num_hidden_layers=1)
    models = {mode: BertPretrainingModel(one_layer, recompute=mode) for mode in ("none", "attention", "layer")}
    for model in models.values():
        model.build()
        for weight, source in zip(model.weights, models["none"].weights):
            weight.assign(source)
    seed = tf.constant([3, 4])
    for features in (unpacked, packed):
        results = {}
        for mode, model in models.items():
            @tf.function
            def loss_and_gradients(features, model=model):
                with tf.GradientTape() as tape:
                    loss = loss_from_sums(pretraining_sums(model(features, training=True, dropout_seed=seed), features))
                return loss, tape.gradient(loss, model.trainable_variables)

            results[mode] = loss_and_gradients(features)
        loss, gradients = results["none"]
        for mode in ("attention", "layer"):
            assert float(results[mode][0]) == pytest.approx(float(loss), abs=1e-6)
            for a, b in zip(gradients, results[mode][1]):
                np.testing.assert_allclose(tf.convert_to_tensor(b).numpy(), tf.convert_to_tensor(a).numpy(), rtol=0,
                                           atol=1e-6)


def test_xla_matches_eager(model, data):
    _, _, packed, _ = data
    compiled = tf.function(lambda features: model(features), jit_compile=True)
    np.testing.assert_allclose(compiled(packed)["mlm_logits"].numpy(), model(packed)["mlm_logits"].numpy(),
                               atol=1e-4)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_float32_where_it_matters(data, policy):
    import keras

    _, _, packed, _ = data
    reference = BertPretrainingModel(CONFIG)
    reference.build()
    keras.mixed_precision.set_global_policy(policy)
    try:
        half = BertPretrainingModel(CONFIG)
        half.build()
        for a, b in zip(half.weights, reference.weights):
            a.assign(b)
        outputs = half(packed)
        assert half.encoder.encoder_layers[0].compute_dtype == policy.split("_")[1]
        assert half.encoder.encoder_layers[0].output_layer_norm.compute_dtype == "float32"
        assert all(w.dtype == "float32" for w in half.weights)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert outputs["mlm_logits"].dtype == tf.float32 and outputs["nsp_logits"].dtype == tf.float32
    expected = reference(packed)["mlm_logits"].numpy()
    np.testing.assert_allclose(outputs["mlm_logits"].numpy(), expected, atol=0.1)
    sums = pretraining_sums(outputs, packed)
    assert np.isfinite(float(loss_from_sums(sums)))


def write_tf1_checkpoint(path, values):
    """A checkpoint as google-research/bert writes them: tf.compat.v1 variables and a Saver."""
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.get_variable(name, initializer=tf.constant(value)) for name, value in values.items()]
        variables.append(tf.compat.v1.get_variable("bert/encoder/layer_0/attention/self/query/kernel/adam_m",
                                                   initializer=tf.zeros([2])))  # an optimizer slot: ignored
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, path)


def google_values(model, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=(w.shape[::-1] if transposed else w.shape)).astype(np.float32)
            for name, w, transposed in google_variable_names(model)}


def test_a_google_research_checkpoint_loads_every_weight(tmp_path):
    model = BertPretrainingModel(CONFIG)
    values = google_values(model)
    # 5 embedding weights, 16 a layer, pooler 2, MLM head 5, NSP classifier 2; in the model, a
    # layer's query, key and value kernels and biases are one fused kernel and bias.
    assert len(values) == 5 + 16 * CONFIG.num_hidden_layers + 2 + 5 + 2
    assert len(model.weights) == len(values) - 4 * CONFIG.num_hidden_layers
    path = write_tf1_checkpoint(str(tmp_path / "model.ckpt"), values)
    assert load_google_checkpoint(model, path) == len(values)
    by_name = {name: (w, t) for name, w, t in google_variable_names(model)}
    np.testing.assert_array_equal(by_name["bert/encoder/layer_1/intermediate/dense/kernel"][0].numpy(),
                                  values["bert/encoder/layer_1/intermediate/dense/kernel"])
    fused = model.encoder.encoder_layers[1].query_key_value
    np.testing.assert_array_equal(fused.kernel.numpy(), np.concatenate(
        [values[f"bert/encoder/layer_1/attention/self/{name}/kernel"] for name in ("query", "key", "value")], axis=1))
    np.testing.assert_array_equal(fused.bias.numpy()[CONFIG.hidden_size:2 * CONFIG.hidden_size],
                                  values["bert/encoder/layer_1/attention/self/key/bias"])
    np.testing.assert_array_equal(model.next_sentence.kernel.numpy(),
                                  values["cls/seq_relationship/output_weights"].T)


def test_a_checkpoint_that_does_not_fit_names_its_first_problems_and_counts_them(tmp_path):
    model = BertPretrainingModel(CONFIG)
    values = google_values(model)
    del values["cls/predictions/output_bias"]
    values["bert/pooler/dense/kernel"] = np.zeros((3, 3), np.float32)
    path = write_tf1_checkpoint(str(tmp_path / "model.ckpt"), values)
    with pytest.raises(CheckpointError) as info:
        load_google_checkpoint(model, path)
    assert "does not fit the model (2 problems)" in str(info.value)
    assert "missing cls/predictions/output_bias [60]" in str(info.value)
    assert "bert/pooler/dense/kernel has shape [3, 3], the model needs [32, 32]" in str(info.value)
    for name in [name for name in values if name.startswith("bert/encoder/layer_0/attention/")]:
        values[name] = np.zeros((1,), np.float32)  # many more: the first two, and how many others
    with pytest.raises(CheckpointError) as info:
        load_google_checkpoint(model, write_tf1_checkpoint(str(tmp_path / "many.ckpt"), values))
    assert re.search(r"does not fit the model \((\d+) problems\): [^;]+; [^;]+; and (\d+) more$",
                     str(info.value)) and len(str(info.value)) < 400
    with pytest.raises(CheckpointError, match="cannot read the checkpoint"):
        load_google_checkpoint(model, str(tmp_path / "nothing"))
    # More layers than the model's: each of the model's loaded and the rest left unread, silently.
    deeper = BertPretrainingModel(dataclasses.replace(CONFIG, num_hidden_layers=CONFIG.num_hidden_layers + 1))
    path = write_tf1_checkpoint(str(tmp_path / "deeper.ckpt"), google_values(deeper))
    with pytest.raises(CheckpointError, match=rf"does not fit the model \(1 problem\): it holds "
                                              rf"{CONFIG.num_hidden_layers + 1} layers \(bert/encoder/layer_N\), the "
                                              rf"model {CONFIG.num_hidden_layers} \(num_hidden_layers"):
        load_google_checkpoint(model, path)


def test_a_torn_checkpoint_is_one_line_and_changes_no_weight(tmp_path):
    model = BertPretrainingModel(CONFIG)
    path = write_tf1_checkpoint(str(tmp_path / "model.ckpt"), google_values(model, seed=1))
    before = [w.numpy() for w in model.weights]
    data = next(p for p in tmp_path.iterdir() if ".data-" in p.name)
    data.write_bytes(data.read_bytes()[:data.stat().st_size // 2])  # a copy cut short (it was an IndexError)
    with pytest.raises(CheckpointError, match=rf"^{path}: cannot read bert/\S+ \(Read less bytes than requested\): "
                                              r"the checkpoint is cut short or damaged$"):
        load_google_checkpoint(model, path)
    assert all(np.array_equal(w.numpy(), b) for w, b in zip(model.weights, before))


def test_export_then_import_round_trips(model, data, tmp_path):
    _, _, packed, _ = data
    path = export_google_checkpoint(model, str(tmp_path / "exported"))
    assert tf.train.load_checkpoint(path).has_tensor("bert/encoder/layer_1/attention/output/LayerNorm/gamma")
    other = BertPretrainingModel(CONFIG)
    load_google_checkpoint(other, path)
    np.testing.assert_array_equal(other(packed)["mlm_logits"].numpy(), model(packed)["mlm_logits"].numpy())


def test_config_files(tmp_path):
    for name, hidden in [("tiny", 128), ("mini", 256), ("base", 768), ("large", 1024)]:
        assert BertConfig.from_json_file(f"configs/bert_config_{name}.json").hidden_size == hidden
    large = BertConfig.from_json_file("configs/bert_config_large.json")
    assert (large.num_hidden_layers, large.num_attention_heads, large.intermediate_size) == (24, 16, 4096)
    bad = tmp_path / "bert_config.json"
    bad.write_text(json.dumps({**large.to_dict(), "num_attention_heads": 5}))
    with pytest.raises(ConfigError, match="bert_config.json: hidden_size 1024 is not a multiple of"):
        BertConfig.from_json_file(str(bad))
    bad.write_text(json.dumps({"hidden_sizes": 3}))
    with pytest.raises(ConfigError, match=r"unknown keys \['hidden_sizes'\]"):
        BertConfig.from_json_file(str(bad))


# Training checkpoints written by the code of 2c189b7, before the encoder became a model of its own:
# a tiny model of each kind as a run saves it (the model, Adam, the step), each weight drawn from
# its TF1 name, each Adam slot twice (momentum) and three times (velocity) its weight.
BEFORE_THE_ENCODER = BertConfig(vocab_size=16, hidden_size=4, num_hidden_layers=2, num_attention_heads=1,
                                intermediate_size=8, max_position_embeddings=8)


@pytest.mark.parametrize("kind", ["pretraining", "pretraining_without_nsp", "classifier", "span"])
def test_a_run_s_checkpoint_from_before_the_encoder_was_its_own_model_restores_every_weight_and_slot(kind, tmp_path):
    """A training checkpoint holds most weights by their place in the optimizer's list: a model
    that lists them in another order would resume with weights swapped where shapes agree (the
    pooler and the masked-LM transform are both [H, H])."""
    import shutil
    import zlib

    import keras

    from bert_packed.model import BertClassifierModel, BertQuestionAnsweringModel
    from bert_packed.training.checkpoints import Checkpoints, load_run_weights

    run = shutil.copytree(f"{__file__.rsplit('/', 1)[0]}/data/checkpoints_of_2c189b7/{kind}", tmp_path / kind)
    config = BEFORE_THE_ENCODER
    model = {"pretraining": lambda: BertPretrainingModel(config),
             "pretraining_without_nsp": lambda: BertPretrainingModel(config, next_sentence_prediction=False),
             "classifier": lambda: BertClassifierModel(config, 3),
             "span": lambda: BertQuestionAnsweringModel(config)}[kind]()
    model.build()
    assert load_run_weights(model, str(run)) == (str(run / "checkpoints" / "ckpt-1"), 1)
    for name, weight, _ in google_variable_names(model):
        expected = np.random.default_rng(zlib.crc32(name.encode())).normal(size=weight.shape).astype(np.float32)
        np.testing.assert_array_equal(weight.numpy(), expected, err_msg=name)
    resumed = keras.optimizers.Adam()  # as a run resumes: the model, its optimizer and the step
    resumed.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    Checkpoints(str(run / "checkpoints"), tf.train.Checkpoint(model=model, optimizer=resumed, step=step), keep=1).restore()
    assert int(step.numpy()) == 1
    for variable in model.trainable_variables:
        index = resumed._get_variable_index(variable)
        np.testing.assert_array_equal(resumed._momentums[index].numpy(), 2 * variable.numpy(), err_msg=variable.path)
        np.testing.assert_array_equal(resumed._velocities[index].numpy(), 3 * variable.numpy(), err_msg=variable.path)


def test_another_keras_backend_is_refused_in_one_line_naming_the_variable():
    """The models are TensorFlow's: Keras on jax (a user's KERAS_BACKEND for other work) was an
    internal error at the first checkpoint; a command now runs Keras on TensorFlow's backend
    (tests/test_reference.py's eval command), and a notebook's other backend is refused."""
    from bert_packed.errors import SettingsError
    from bert_packed.model.modeling import require_tensorflow_backend

    require_tensorflow_backend("tensorflow")
    with pytest.raises(SettingsError, match=r"^Keras runs on its jax backend \(KERAS_BACKEND or ~/.keras/keras.json\), "
                                            r"and bert-packed's models need its tensorflow backend: set "
                                            r"KERAS_BACKEND=tensorflow before Keras is imported$"):
        require_tensorflow_backend("jax")
