"""LAMB, AdamW and the schedule against an independent NumPy implementation of the reference."""

import re

import keras
import numpy as np
import pytest

from bert_packed.training.batching import adjusted_betas
from bert_packed.training.optimizers import AdamWeightDecay, Lamb, PolynomialWarmup

NAMES = ("layer_0/query/kernel", "layer_0/query/bias", "embeddings/LayerNorm/gamma", "pooler/kernel")


def reference_update(weights, gradient_steps, learning_rates, beta_1, beta_2, epsilon, decay, clip,
                     bias_correction=True, layer_adaptation=True, excluded=("LayerNorm", "layer_norm", "bias")):
    """The MLPerf LAMB (or BERT AdamW) update, written out in NumPy, one step at a time."""
    weights = {k: v.astype(np.float64).copy() for k, v in weights.items()}
    m = {k: np.zeros_like(v) for k, v in weights.items()}
    v = {k: np.zeros_like(w) for k, w in weights.items()}
    for t, (gradients, lr) in enumerate(zip(gradient_steps, learning_rates), start=1):
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in gradients.values()))
        scale = clip / max(norm, clip)
        for name, w in weights.items():
            g = gradients[name] * scale
            m[name] = beta_1 * m[name] + (1 - beta_1) * g
            v[name] = beta_2 * v[name] + (1 - beta_2) * g * g
            if bias_correction:
                update = (m[name] / (1 - beta_1 ** t)) / (np.sqrt(v[name] / (1 - beta_2 ** t)) + epsilon)
            else:
                update = m[name] / (np.sqrt(v[name]) + epsilon)
            skip = any(re.search(p, name) for p in excluded)
            if not skip:
                update = update + decay * w
            ratio = 1.0
            if layer_adaptation and not skip:
                w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(update)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            weights[name] = w - lr * ratio * update
    return weights


def variable_at(path, value):
    """A variable whose path is `path`, as a model's layers would give it."""
    *scopes, name = path.split("/")
    if not scopes:
        return keras.Variable(value, name=name)
    with keras.name_scope(scopes[0]):
        return variable_at("/".join(scopes[1:] + [name]), value)


def run_keras(optimizer, weights, gradient_steps):
    variables = [variable_at(name, weights[name]) for name in NAMES]
    assert [v.path for v in variables] == list(NAMES)
    for gradients in gradient_steps:
        optimizer.apply_gradients([(gradients[name], var) for name, var in zip(NAMES, variables)])
    return {name: var.numpy() for name, var in zip(NAMES, variables)}


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    shapes = {NAMES[0]: (4, 3), NAMES[1]: (3,), NAMES[2]: (3,), NAMES[3]: (3, 2)}
    weights = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    weights[NAMES[3]][:] = 0.0  # a zero weight: trust ratio 1
    steps = [{name: (rng.normal(size=shape) * (3.0 if i % 2 else 0.1)).astype(np.float32)
              for name, shape in shapes.items()} for i in range(6)]  # odd steps exceed the clip norm
    return weights, steps


@pytest.mark.parametrize("packing_factor, fused", [(1.0, False), (1.7, False), (1.7, True)])
def test_lamb_matches_the_reference_update(problem, packing_factor, fused):
    weights, steps = problem
    beta_1, beta_2 = adjusted_betas(0.9, 0.999, packing_factor)
    schedule = PolynomialWarmup(0.01, num_train_steps=10, num_warmup_steps=3)
    optimizer = Lamb(schedule, beta_1=beta_1, beta_2=beta_2, epsilon=1e-6, weight_decay_rate=0.01, clip_norm=1.0,
                     fused=fused)
    ours = run_keras(optimizer, weights, steps)
    rates = [float(schedule(step)) for step in range(len(steps))]
    expected = reference_update(weights, steps, rates, beta_1, beta_2, 1e-6, 0.01, 1.0)
    for name in NAMES:
        np.testing.assert_allclose(ours[name], expected[name], rtol=1e-5, atol=1e-7)
    assert not np.allclose(ours[NAMES[3]], 0.0)  # the zero weight moved (ratio 1)


@pytest.mark.parametrize("fused", [False, True])  # each weight's step one XLA program (--xla)
def test_adamw_without_bias_correction_matches_the_reference(problem, fused):
    weights, steps = problem
    optimizer = AdamWeightDecay(1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay_rate=0.01, clip_norm=1.0,
                                fused=fused)
    ours = run_keras(optimizer, weights, steps)
    expected = reference_update(weights, steps, [1e-3] * len(steps), 0.9, 0.999, 1e-6, 0.01, 1.0,
                                bias_correction=False, layer_adaptation=False)
    for name in NAMES:
        np.testing.assert_allclose(ours[name], expected[name], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("fused", [False, True])
def test_a_weight_s_step_is_traced_once_a_kind_not_once_a_weight_or_a_shape(problem, fused):
    """LAMB's step over BERT-Large's 302 weights traces 5,531 operations, 6,026 with a step a
    shape (scripts/benchmark_optimizer.py's operations column; docs/training.md)."""
    weights, steps = problem
    optimizer = Lamb(1e-3, fused=fused)
    run_keras(optimizer, weights, steps)
    # (4, 3) and (3, 2) decayed and adapted; the bias and the LayerNorm gamma, both (3,), neither.
    traces = {kind[:2]: step.experimental_get_tracing_count() for kind, step in optimizer._steps.items()}
    assert traces == {(True, True): 1, (False, False): 1}  # once a kind, not once a shape (3 traces)


def test_exclusions_change_the_update(problem):
    weights, steps = problem
    default = run_keras(Lamb(1e-3), weights, steps)
    nothing_excluded = run_keras(Lamb(1e-3, exclude_from_weight_decay=()), weights, steps)
    assert not np.allclose(default[NAMES[1]], nothing_excluded[NAMES[1]])
    np.testing.assert_allclose(default[NAMES[0]], nothing_excluded[NAMES[0]], rtol=1e-6)


@pytest.mark.parametrize("start, expected", [
    (0, {0: 0.0, 50: 0.5e-3, 99: 0.99e-3, 100: 0.9e-3, 500: 0.5e-3, 1000: 0.0, 1200: 0.0}),
    (-40, {0: 0.4e-3, 59: 0.99e-3, 60: 0.94e-3, 1000: 0.0}),
])
def test_schedule_at_warmup_start_end_and_final_step(start, expected):
    schedule = PolynomialWarmup(1e-3, num_train_steps=1000, num_warmup_steps=100, start_warmup_step=start)
    for step, rate in expected.items():
        assert float(schedule(step)) == pytest.approx(rate, abs=1e-9), step


def test_schedule_without_warmup_and_with_power():
    schedule = PolynomialWarmup(2e-3, num_train_steps=100, power=2.0)
    assert float(schedule(0)) == pytest.approx(2e-3)
    assert float(schedule(50)) == pytest.approx(2e-3 * 0.25)
    with pytest.raises(ValueError):
        PolynomialWarmup(1e-3, num_train_steps=0)
    with pytest.raises(ValueError, match="packing factor is at least 1"):
        adjusted_betas(0.9, 0.999, 0.5)


def test_a_compiled_schedule_takes_the_numbers_it_is_set_to():
    """One traced graph serves any peak and length (what lets one compiled step serve any run)."""
    import tensorflow as tf

    schedule = PolynomialWarmup(1e-3, num_train_steps=1000, num_warmup_steps=100, steps_per_update=2)
    rate = tf.function(schedule)
    steps = (0, 20, 49, 50, 300, 600)
    assert [float(rate(tf.constant(s))) for s in steps] == pytest.approx(
        [0.0, 0.4e-3, 0.98e-3, 0.9e-3, 0.4e-3, 0.0], abs=1e-9)
    schedule.set(2e-3, num_train_steps=400, num_warmup_steps=0, start_warmup_step=0)
    fresh = PolynomialWarmup(2e-3, num_train_steps=400, steps_per_update=2)
    assert [float(rate(tf.constant(s))) for s in steps] == [float(fresh(s)) for s in steps]
    assert float(rate(tf.constant(50))) == pytest.approx(2e-3 * 0.75, abs=1e-9)
    assert rate.experimental_get_tracing_count() == 1
    with pytest.raises(ValueError, match="num_train_steps must be >= 1"):
        schedule.set(1e-3, num_train_steps=0)


def test_on_the_model_layernorm_and_biases_are_excluded_and_the_rest_decayed():
    from bert_packed.model import BertConfig, BertPretrainingModel

    model = BertPretrainingModel(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                            intermediate_size=16, max_position_embeddings=16))
    model.build()
    optimizer = Lamb(1e-3)
    optimizer.build(model.trainable_variables)
    decayed = {v.path.split("/", 1)[1] for v, d in zip(model.trainable_variables, optimizer._decayed) if d}
    assert decayed == {"encoder/embeddings/word_embeddings", "encoder/embeddings/position_embeddings",
                       "encoder/embeddings/token_type_embeddings", "encoder/layer_0/query_key_value/kernel",
                       "encoder/layer_0/attention_output/kernel", "encoder/layer_0/intermediate/kernel",
                       "encoder/layer_0/output/kernel", "encoder/pooler/kernel", "seq_relationship/kernel",
                       "masked_lm/transform/kernel"}
    assert optimizer._adapted == optimizer._decayed
