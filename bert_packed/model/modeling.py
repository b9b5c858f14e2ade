"""BERT for pre-training on packed rows, in Keras 3 on TensorFlow: the encoder (BertEncoder, the
embeddings, the layers and the pooler as one model) and the pre-training heads on it.

A row holds one or more sequences. Only four things differ from BERT on one sequence per row:
positions restart at 0 for each sequence (gathered from `positions`), attention stays inside a
sequence (block-diagonal mask from the sequence indices, `sequence_ids`), the masked-LM head is
applied only at `masked_lm_positions`, and the NSP head reads each sequence's own [CLS] at
`next_sentence_positions`. Everything else is token-wise and does not care who shares a row
(docs/model.md).

Shape legend: B batch, L max_seq_length, H hidden_size, N attention heads, D = H / N,
I intermediate_size, V vocab_size, P' predictions per row, S sequences per row.

Mixed precision: under a `mixed_bfloat16` or `mixed_float16` policy the matmuls run in half
precision while LayerNorm, the attention softmax and the returned logits are float32.

Dropout is stateless: each site's mask is a function of a seed the caller gives (the trainer
derives it from the run's seed, the micro-step and the replica), folded with the layer and the
site. So a forward pass recomputed in the backward pass (`recompute`), a resumed run and a
repeated run draw the same masks; Keras's stateful seed generator, which draws a new mask when a
block is recomputed (wrong gradients), is not used.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from bert_packed.errors import SettingsError
from bert_packed.model.config import RECOMPUTE, BertConfig


def require_tensorflow_backend(backend: str) -> None:
    """The models are TensorFlow's (tf.function, tf.train.Checkpoint, tf.distribute): Keras must run
    on its TensorFlow backend. The commands choose it; a notebook chooses before Keras loads."""
    if backend != "tensorflow":
        raise SettingsError(f"Keras runs on its {backend} backend (KERAS_BACKEND or ~/.keras/keras.json), and "
                            f"bert-packed's models need its tensorflow backend: set KERAS_BACKEND=tensorflow "
                            f"before Keras is imported")


require_tensorflow_backend(keras.backend.backend())

LAYER_NORM_EPSILON = 1e-12  # google-research/bert's, in every layer norm
# The dropout sites of a transformer layer, folded into its seed.
ATTENTION_PROBABILITIES, ATTENTION_OUTPUT, FEED_FORWARD_OUTPUT = 1, 2, 3


def dropout(x: tf.Tensor, rate: float, seed: tf.Tensor) -> tf.Tensor:
    """Inverted dropout whose mask is a function of `seed` alone (the same seed, the same mask).

    Args:
      x: any shape, any float dtype.
      rate: the probability of dropping an element, in [0, 1).
      seed: int32 [2], a stateless seed (tf.random.stateless_*).

    Returns:
      x with each element zeroed with probability `rate` and the rest scaled by 1 / (1 - rate).
    """
    if rate == 0.0:
        return x
    keep = tf.random.stateless_uniform(tf.shape(x), seed, dtype=tf.float32, alg="philox") >= rate
    return x * tf.cast(keep, x.dtype) * tf.cast(1.0 / (1.0 - rate), x.dtype)


def fold_seed(seed: tf.Tensor, *indices: int) -> tf.Tensor:
    """`seed` folded with each of `indices` in turn: a distinct stateless seed for each tuple."""
    for index in indices:
        seed = tf.random.experimental.stateless_fold_in(seed, index)
    return seed


def attention_mask_from_sequence_ids(sequence_ids: tf.Tensor) -> tf.Tensor:
    """Block-diagonal attention mask: token i may attend to token j iff they share a sequence.

    Padding (index 0) attends only to padding, which keeps every softmax row finite.

    >>> attention_mask_from_sequence_ids(tf.constant([[1, 1, 2, 0]])).numpy().astype(int)[0]
    array([[1, 1, 0, 0],
           [1, 1, 0, 0],
           [0, 0, 1, 0],
           [0, 0, 0, 1]])

    Args:
      sequence_ids: int [B, L], the sequence index of each token (1..S), 0 for padding.

    Returns:
      bool [B, L, L].
    """
    return tf.equal(sequence_ids[:, :, None], sequence_ids[:, None, :])


def attention_bias_from_mask(mask: tf.Tensor) -> tf.Tensor:
    """float32 additive attention bias, 0 where allowed and -10000 where not (google-research).

    Built once per forward pass from a bool mask [B, L, L] (or [B, 1, L] for padding only) and
    broadcast over heads: [B, 1, L, L].
    """
    return (1.0 - tf.cast(mask[:, None, :, :], tf.float32)) * -10000.0


def recomputed(function, inputs: tuple, attention_bias: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """function(*inputs, attention_bias, seed), whose backward pass recomputes it instead of keeping
    its activations.

    tf.recompute_grad differentiates with respect to every argument and makes each argument's
    recomputation depend on the incoming gradient, so that XLA cannot merge the recomputation
    with the forward pass (and keep what it was to free). So the inputs to differentiate are
    arguments; the attention bias, which needs no gradient, is closed over; and the seed is an
    argument as float64 (int32 values are exact in it; an int argument cannot be watched): closed
    over, XLA could keep the forward pass's random numbers for the backward pass instead of
    drawing them again.
    """
    def with_seed(*arguments):
        *tensors, seed_value = arguments
        return function(*tensors, attention_bias, tf.cast(seed_value, tf.int32))

    return tf.recompute_grad(with_seed)(*inputs, tf.cast(seed, tf.float64))


def initializer(config_range: float):
    return keras.initializers.TruncatedNormal(stddev=config_range)


class BertEmbeddings(keras.layers.Layer):
    """Word + per-sequence position + token-type embeddings, LayerNorm, dropout."""

    def __init__(self, vocab_size, hidden_size, max_position_embeddings, type_vocab_size, initializer_range,
                 dropout, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.dropout = dropout
        self.layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32", name="LayerNorm")

    def build(self, input_shape=None):
        init = initializer(self.initializer_range)
        self.word_embeddings = self.add_weight(name="word_embeddings", shape=[self.vocab_size, self.hidden_size],
                                               initializer=init)
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=[self.max_position_embeddings, self.hidden_size], initializer=init)
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings", shape=[self.type_vocab_size, self.hidden_size], initializer=init)
        self.layer_norm.build([None, None, self.hidden_size])

    def call(self, input_ids, segment_ids, positions, seed=None):
        """Args: int [B, L] each; seed: int32 [2] to apply dropout with (None: no dropout)."""
        embeddings = (tf.gather(self.word_embeddings, input_ids)            # [B, L, H]
                      + tf.gather(self.position_embeddings, positions)
                      + tf.gather(self.token_type_embeddings, segment_ids))
        embeddings = tf.cast(self.layer_norm(embeddings), self.compute_dtype)
        return embeddings if seed is None else dropout(embeddings, self.dropout, seed)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "max_position_embeddings": self.max_position_embeddings, "type_vocab_size": self.type_vocab_size,
                "initializer_range": self.initializer_range, "dropout": self.dropout}


class TransformerLayer(keras.layers.Layer):
    """Post-LayerNorm transformer layer: self-attention, then an exact-erf GELU feed-forward.

    The query, key and value projections are one [H, 3H] dense layer (`query_key_value`, its
    columns query, key, value): one matrix product instead of three. Checkpoints keep the three
    google-research names (model/checkpoint.py splits and joins the kernel).

    Args:
      recompute: one of RECOMPUTE: what the backward pass recomputes instead of keeping.
    """

    def __init__(self, hidden_size, num_attention_heads, intermediate_size, initializer_range, hidden_dropout_prob,
                 attention_probs_dropout_prob, recompute="none", **kwargs):
        super().__init__(**kwargs)
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute={recompute!r}: expected one of {RECOMPUTE}")
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.initializer_range = initializer_range
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.recompute = recompute
        init = initializer(initializer_range)
        self.query_key_value = keras.layers.Dense(3 * hidden_size, kernel_initializer=init, name="query_key_value")
        self.attention_output = keras.layers.Dense(hidden_size, kernel_initializer=init, name="attention_output")
        self.attention_layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32",
                                                                    name="attention_layer_norm")
        self.intermediate = keras.layers.Dense(intermediate_size, kernel_initializer=init, name="intermediate")
        self.output_dense = keras.layers.Dense(hidden_size, kernel_initializer=init, name="output")
        self.output_layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32",
                                                                 name="output_layer_norm")

    def build(self, input_shape):
        hidden, intermediate = [None, None, self.hidden_size], [None, None, self.intermediate_size]
        for layer in (self.query_key_value, self.attention_output, self.intermediate):
            layer.build(hidden)
        self.output_dense.build(intermediate)
        self.attention_layer_norm.build(hidden)
        self.output_layer_norm.build(hidden)

    def call(self, hidden_states, attention_bias, seed=None):
        """One layer.

        Args:
          hidden_states: [B, L, H] (compute dtype).
          attention_bias: float32 [B, 1, L, L] (attention_bias_from_mask).
          seed: int32 [2], this layer's dropout seed; None: no dropout (inference).

        Returns:
          [B, L, H] (compute dtype).
        """
        if seed is None:
            return self._layer(hidden_states, attention_bias, None)
        if self.recompute == "layer":
            return recomputed(self._layer, (hidden_states,), attention_bias, seed)
        return self._layer(hidden_states, attention_bias, seed)

    def _layer(self, hidden_states, attention_bias, seed):
        batch, length = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        heads, head_size = self.num_attention_heads, self.hidden_size // self.num_attention_heads
        projected = tf.reshape(self.query_key_value(hidden_states), [batch, length, 3, heads, head_size])
        query, key, value = tf.unstack(tf.transpose(projected, [2, 0, 3, 1, 4]))   # [B, N, L, D] each
        if seed is not None and self.recompute == "attention":
            context = recomputed(self._attention, (query, key, value), attention_bias, seed)
        else:
            context = self._attention(query, key, value, attention_bias, seed)
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch, length, self.hidden_size])

        attention = self._dropout(self.attention_output(context), self.hidden_dropout_prob, seed, ATTENTION_OUTPUT)
        hidden_states = tf.cast(self.attention_layer_norm(hidden_states + attention), self.compute_dtype)
        intermediate = tf.nn.gelu(self.intermediate(hidden_states), approximate=False)   # [B, L, I]
        output = self._dropout(self.output_dense(intermediate), self.hidden_dropout_prob, seed, FEED_FORWARD_OUTPUT)
        return tf.cast(self.output_layer_norm(hidden_states + output), self.compute_dtype)

    def _attention(self, query, key, value, attention_bias, seed):
        """softmax(Q K^T / sqrt(D) + bias), dropped out, times V: [B, N, L, D] from [B, N, L, D] each."""
        scores = tf.matmul(query, key, transpose_b=True)                      # [B, N, L, L]
        scores = tf.cast(scores, tf.float32) * (1.0 / math.sqrt(self.hidden_size // self.num_attention_heads))
        scores += tf.cast(attention_bias, tf.float32)  # [B, 1, L, L]; Keras casts float inputs to compute dtype
        probabilities = tf.cast(tf.nn.softmax(scores, axis=-1), self.compute_dtype)
        probabilities = self._dropout(probabilities, self.attention_probs_dropout_prob, seed, ATTENTION_PROBABILITIES)
        return tf.matmul(probabilities, value)                                # [B, N, L, D]

    @staticmethod
    def _dropout(x, rate, seed, site):
        return x if seed is None else dropout(x, rate, fold_seed(seed, site))

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "num_attention_heads": self.num_attention_heads, "intermediate_size": self.intermediate_size,
                "initializer_range": self.initializer_range, "hidden_dropout_prob": self.hidden_dropout_prob,
                "attention_probs_dropout_prob": self.attention_probs_dropout_prob, "recompute": self.recompute}


class MaskedLMHead(keras.layers.Layer):
    """Dense + GELU + LayerNorm at the masked positions, then the tied word embeddings + a bias."""

    def __init__(self, hidden_size, vocab_size, initializer_range, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.initializer_range = initializer_range
        self.transform = keras.layers.Dense(hidden_size, kernel_initializer=initializer(initializer_range),
                                            name="transform")
        self.layer_norm = keras.layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, dtype="float32", name="LayerNorm")

    def build(self, input_shape=None):
        self.transform.build([None, None, self.hidden_size])
        self.layer_norm.build([None, None, self.hidden_size])
        self.output_bias = self.add_weight(name="output_bias", shape=[self.vocab_size], initializer="zeros")

    def call(self, sequence_output, masked_lm_positions, word_embeddings):
        hidden = tf.gather(sequence_output, masked_lm_positions, batch_dims=1)   # [B, P', H]
        hidden = tf.nn.gelu(self.transform(hidden), approximate=False)
        hidden = tf.cast(self.layer_norm(hidden), self.compute_dtype)
        logits = tf.matmul(hidden, tf.cast(word_embeddings, self.compute_dtype), transpose_b=True)  # [B, P', V]
        # Keras reads variables in the compute dtype inside call(); logits are float32.
        return tf.cast(logits, tf.float32) + tf.cast(self.output_bias, tf.float32)

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
                "initializer_range": self.initializer_range}


class BertEncoder(keras.Model):
    """BERT's encoder on packed rows (keras-hub's backbone): the embeddings, the transformer layers
    and, with `with_pooler`, google-research's bert/pooler (dense + tanh on a sequence's [CLS]).
    The pre-training, classification and span models each wrap one, and own only their heads: a
    fine-tuned model holds no masked-LM or next-sentence weights.

    Inputs (int32): input_ids, sequence_ids (sequence index per token, 1..S, 0 padding; the
    records' input_mask), segment_ids, positions [B, L]. Other keys are ignored.

    Args:
      config: the BERT hyper-parameters.
      with_pooler: with the pooler (the next-sentence head's and the classifier's input); the
        span model, like google-research's run_squad, reads the sequence output alone.
      recompute: one of RECOMPUTE: what the backward pass of training recomputes instead of
        keeping (the same gradients, less memory, more time: docs/launch.md).

    Called as encoder(features, training=False, dropout_seed=None): in training, dropout draws
    its masks from `dropout_seed` (int32 [2]; None: a random one), folded with each layer and site
    (the embeddings 0, layer i i + 1).

    Returns:
      The sequence output, [B, L, H] in the compute dtype.
    """

    def __init__(self, config: BertConfig, with_pooler: bool = True, recompute: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.with_pooler = with_pooler
        self.recompute = recompute
        self.embeddings = BertEmbeddings(config.vocab_size, config.hidden_size, config.max_position_embeddings,
                                         config.type_vocab_size, config.initializer_range,
                                         config.hidden_dropout_prob, name="embeddings")
        self.encoder_layers = [
            TransformerLayer(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                             config.initializer_range, config.hidden_dropout_prob,
                             config.attention_probs_dropout_prob, recompute, name=f"layer_{i}")
            for i in range(config.num_hidden_layers)]
        self.pooler = (keras.layers.Dense(config.hidden_size, activation="tanh",
                                          kernel_initializer=initializer(config.initializer_range), name="pooler")
                       if with_pooler else None)

    def build(self, input_shape=None):
        self.embeddings.build()
        for layer in self.encoder_layers:
            layer.build([None, None, self.config.hidden_size])
        if self.pooler is not None:
            self.pooler.build([None, None, self.config.hidden_size])
        self.built = True

    def call(self, features, training=False, dropout_seed=None):
        if training and dropout_seed is None:
            dropout_seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
        seed = (lambda index: fold_seed(dropout_seed, index)) if training else (lambda index: None)
        hidden = self.embeddings(features["input_ids"], features["segment_ids"], features["positions"], seed(0))
        bias = attention_bias_from_mask(attention_mask_from_sequence_ids(features["sequence_ids"]))
        for i, layer in enumerate(self.encoder_layers):
            hidden = layer(hidden, bias, seed(i + 1))
        return hidden                                                                       # [B, L, H]

    def pool(self, sequence_output: tf.Tensor, cls_positions: tf.Tensor) -> tf.Tensor:
        """The pooler's output at each sequence's own [CLS] (`cls_positions` [B, S]): [B, S, H]."""
        return self.pooler(tf.gather(sequence_output, cls_positions, batch_dims=1))

    def get_config(self):
        return {"config": self.config.to_dict(), "with_pooler": self.with_pooler, "recompute": self.recompute}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config.get("with_pooler", True), config.get("recompute", "none"))


class BertPretrainingModel(keras.Model):
    """BERT with masked-LM and next-sentence heads on its encoder, called on the packed feature dict.

    Inputs (int32): BertEncoder's, and masked_lm_positions [B, P']; next_sentence_positions
    [B, S]. Other keys (labels, prediction_sequence_ids, weights) are ignored.

    Args:
      config: the BERT hyper-parameters.
      next_sentence_prediction: with the next-sentence head (the encoder's pooler and a 2-way
        classifier); without it the model is masked-LM only (RoBERTa's objective), its encoder
        has no pooler, and no [CLS] output is gathered.
      recompute: as BertEncoder's.

    Called as model(features, training=False, dropout_seed=None), as BertEncoder.

    Returns:
      {"mlm_logits": float32 [B, P', V], "nsp_logits": float32 [B, S, 2]} ("nsp_logits" only
      with the next-sentence head).
    """

    def __init__(self, config: BertConfig, next_sentence_prediction: bool = True, recompute: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.next_sentence_prediction = next_sentence_prediction
        self.recompute = recompute
        self.encoder = BertEncoder(config, with_pooler=next_sentence_prediction, recompute=recompute, name="encoder")
        self.masked_lm = MaskedLMHead(config.hidden_size, config.vocab_size, config.initializer_range,
                                      name="masked_lm")
        self.next_sentence = (keras.layers.Dense(2, kernel_initializer=initializer(config.initializer_range),
                                                 name="seq_relationship")
                              if next_sentence_prediction else None)

    def build(self, input_shape=None):
        self.encoder.build()
        self.masked_lm.build()
        if self.next_sentence is not None:
            self.next_sentence.build([None, None, self.config.hidden_size])
        self.built = True

    # A training checkpoint holds the trainable weights by their place in this order (TensorFlow's
    # object graph reaches them through the optimizer's list): the order of the model before the
    # encoder was its own, the pooler after the masked-LM head. Kept, so that every run resumes.
    @property
    def variables(self):
        return self._in_checkpoint_order(super().variables)

    @property
    def weights(self):
        return self._in_checkpoint_order(super().weights)

    def _in_checkpoint_order(self, variables: list) -> list:
        if self.next_sentence is None:
            return variables
        last = {id(v) for v in self.encoder.pooler.weights + self.next_sentence.weights}
        return [v for v in variables if id(v) not in last] + [v for v in variables if id(v) in last]

    def call(self, features, training=False, dropout_seed=None):
        sequence_output = self.encoder(features, training=training, dropout_seed=dropout_seed)  # [B, L, H]
        outputs = {"mlm_logits": self.masked_lm(sequence_output, features["masked_lm_positions"],
                                                self.encoder.embeddings.word_embeddings)}
        if self.next_sentence is not None:
            pooled = self.encoder.pool(sequence_output, features["next_sentence_positions"])         # [B, S, H]
            outputs["nsp_logits"] = tf.cast(self.next_sentence(pooled), tf.float32)                 # [B, S, 2]
        return outputs

    def get_config(self):
        return {"config": self.config.to_dict(), "next_sentence_prediction": self.next_sentence_prediction,
                "recompute": self.recompute}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config.get("next_sentence_prediction", True),
                   config.get("recompute", "none"))
