"""BERT for pre-training on packed rows, in Keras 3 on TensorFlow.

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

from bert_packed.model.config import RECOMPUTE, BertConfig

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


def _initializer(config_range: float):
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
        init = _initializer(self.initializer_range)
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
        init = _initializer(initializer_range)
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
        self.transform = keras.layers.Dense(hidden_size, kernel_initializer=_initializer(initializer_range),
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


class NextSentenceHead(keras.layers.Layer):
    """Pooler (dense + tanh) on each sequence's own [CLS], then a 2-way classifier."""

    def __init__(self, hidden_size, initializer_range, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range
        init = _initializer(initializer_range)
        self.pooler = keras.layers.Dense(hidden_size, activation="tanh", kernel_initializer=init, name="pooler")
        self.classifier = keras.layers.Dense(2, kernel_initializer=init, name="seq_relationship")

    def build(self, input_shape=None):
        self.pooler.build([None, None, self.hidden_size])
        self.classifier.build([None, None, self.hidden_size])

    def call(self, sequence_output, next_sentence_positions):
        cls = tf.gather(sequence_output, next_sentence_positions, batch_dims=1)  # [B, S, H]
        return tf.cast(self.classifier(self.pooler(cls)), tf.float32)           # [B, S, 2]

    def get_config(self):
        return {**super().get_config(), "hidden_size": self.hidden_size,
                "initializer_range": self.initializer_range}


class BertPretrainingModel(keras.Model):
    """BERT with masked-LM and next-sentence heads, called on the packed feature dict.

    Inputs (int32): input_ids, sequence_ids (sequence index per token, 1..S, 0 padding; the
    records' input_mask), segment_ids, positions [B, L]; masked_lm_positions [B, P'];
    next_sentence_positions [B, S]. Other keys (labels, prediction_sequence_ids, weights) are
    ignored.

    Args:
      config: the BERT hyper-parameters.
      next_sentence_prediction: with the next-sentence head (pooler and classifier); without it
        the model is masked-LM only (RoBERTa's objective), and no [CLS] output is gathered.
      recompute: one of RECOMPUTE: what the backward pass of training recomputes instead of
        keeping (the same gradients, less memory, more time: docs/launch.md).

    Called as model(features, training=False, dropout_seed=None): in training, dropout draws its
    masks from `dropout_seed` (int32 [2]; None: a random one), folded with each layer and site.

    Returns:
      {"mlm_logits": float32 [B, P', V], "nsp_logits": float32 [B, S, 2]} ("nsp_logits" only
      with the next-sentence head).
    """

    def __init__(self, config: BertConfig, next_sentence_prediction: bool = True, recompute: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.next_sentence_prediction = next_sentence_prediction
        self.recompute = recompute
        self.embeddings = BertEmbeddings(config.vocab_size, config.hidden_size, config.max_position_embeddings,
                                         config.type_vocab_size, config.initializer_range,
                                         config.hidden_dropout_prob, name="embeddings")
        self.encoder_layers = [
            TransformerLayer(config.hidden_size, config.num_attention_heads, config.intermediate_size,
                             config.initializer_range, config.hidden_dropout_prob,
                             config.attention_probs_dropout_prob, recompute, name=f"layer_{i}")
            for i in range(config.num_hidden_layers)]
        self.masked_lm = MaskedLMHead(config.hidden_size, config.vocab_size, config.initializer_range,
                                      name="masked_lm")
        self.next_sentence = (NextSentenceHead(config.hidden_size, config.initializer_range, name="next_sentence")
                              if next_sentence_prediction else None)

    def build(self, input_shape=None):
        self.embeddings.build()
        for layer in self.encoder_layers:
            layer.build([None, None, self.config.hidden_size])
        self.masked_lm.build()
        if self.next_sentence is not None:
            self.next_sentence.build()
        self.built = True

    def encode(self, features, training=False, dropout_seed=None):
        """The encoder's output for every token: [B, L, H] (compute dtype)."""
        if training and dropout_seed is None:
            dropout_seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
        seed = (lambda index: fold_seed(dropout_seed, index)) if training else (lambda index: None)
        hidden = self.embeddings(features["input_ids"], features["segment_ids"], features["positions"], seed(0))
        bias = attention_bias_from_mask(attention_mask_from_sequence_ids(features["sequence_ids"]))
        for i, layer in enumerate(self.encoder_layers):
            hidden = layer(hidden, bias, seed(i + 1))
        return hidden

    def call(self, features, training=False, dropout_seed=None):
        sequence_output = self.encode(features, training=training, dropout_seed=dropout_seed)
        outputs = {"mlm_logits": self.masked_lm(sequence_output, features["masked_lm_positions"],
                                                self.embeddings.word_embeddings)}
        if self.next_sentence is not None:
            outputs["nsp_logits"] = self.next_sentence(sequence_output, features["next_sentence_positions"])
        return outputs

    def get_config(self):
        return {"config": self.config.to_dict(), "next_sentence_prediction": self.next_sentence_prediction,
                "recompute": self.recompute}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config.get("next_sentence_prediction", True),
                   config.get("recompute", "none"))


class BertClassifierModel(keras.Model):
    """BERT fine-tuned to classify (or score) each sequence of a row: google-research's
    run_classifier head on each sequence's own [CLS].

    The encoder and the pooler are a BertPretrainingModel's (`bert`, with the next-sentence head,
    whose pooler is google-research's bert/pooler), so every weight format that model loads
    (model.load_weights) starts a fine-tuning run; its masked-LM head and next-sentence
    classifier are kept (a checkpoint of either model reads the other's weights) but not trained.
    On the pooled [CLS]: dropout at hidden_dropout_prob, then `classifier` (google-research's
    output_weights and output_bias).

    Inputs (int32): input_ids, sequence_ids, segment_ids, positions [B, L]; cls_positions [B, S]
    (bert_packed.features' fine-tuning rows). Other keys are ignored.

    Args:
      config: the BERT hyper-parameters.
      num_outputs: the classes' logits, or 1 for a regression's score.
      recompute: as BertPretrainingModel's.

    Returns:
      {"logits": float32 [B, S, num_outputs]}.
    """

    def __init__(self, config: BertConfig, num_outputs: int, recompute: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.num_outputs = num_outputs
        self.recompute = recompute
        self.bert = BertPretrainingModel(config, next_sentence_prediction=True, recompute=recompute, name="bert")
        self.classifier = keras.layers.Dense(num_outputs, kernel_initializer=_initializer(config.initializer_range),
                                             name="classifier")

    def build(self, input_shape=None):
        self.bert.build()
        self.bert.masked_lm.trainable = False
        self.bert.next_sentence.classifier.trainable = False
        self.classifier.build([None, None, self.config.hidden_size])
        self.built = True

    def call(self, features, training=False, dropout_seed=None):
        if training and dropout_seed is None:
            dropout_seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
        sequence_output = self.bert.encode(features, training=training, dropout_seed=dropout_seed)   # [B, L, H]
        cls = tf.gather(sequence_output, features["cls_positions"], batch_dims=1)                # [B, S, H]
        pooled = self.bert.next_sentence.pooler(cls)
        if training:  # the encoder's layers take seeds 0..num_hidden_layers
            pooled = dropout(pooled, self.config.hidden_dropout_prob,
                             fold_seed(dropout_seed, self.config.num_hidden_layers + 1))
        return {"logits": tf.cast(self.classifier(pooled), tf.float32)}                          # [B, S, C]

    def get_config(self):
        return {"config": self.config.to_dict(), "num_outputs": self.num_outputs, "recompute": self.recompute}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config["num_outputs"], config.get("recompute", "none"))


# A span logit at a position outside the sequence: its softmax there is 0 (exp underflows).
OUTSIDE_THE_SEQUENCE = -1e9


class BertQuestionAnsweringModel(keras.Model):
    """BERT fine-tuned to find an answer's span in each sequence of a row: google-research's
    run_squad head (a start and an end logit a token), read sequence by sequence.

    Each sequence's logits are gathered from its own tokens, position 0 at its [CLS], and every
    position past its end holds OUTSIDE_THE_SEQUENCE: a softmax over them is the sequence's alone,
    so a sequence gets the same span probabilities wherever it sits in a pack, and alone in a
    padded row. The encoder is a BertPretrainingModel's (`bert`, as BertClassifierModel's), its
    heads kept but not trained; `qa_outputs` is google-research's cls/squad output_weights and
    output_bias.

    Inputs (int32): input_ids, sequence_ids, segment_ids, positions [B, L]; cls_positions [B, S].

    Args:
      config: the BERT hyper-parameters.
      recompute: as BertPretrainingModel's.

    Returns:
      {"start_logits", "end_logits": float32 [B, S, L]}.
    """

    def __init__(self, config: BertConfig, recompute: str = "none", **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.recompute = recompute
        self.bert = BertPretrainingModel(config, next_sentence_prediction=True, recompute=recompute, name="bert")
        self.qa_outputs = keras.layers.Dense(2, kernel_initializer=_initializer(config.initializer_range),
                                             name="qa_outputs")

    def build(self, input_shape=None):
        self.bert.build()
        self.bert.masked_lm.trainable = False
        self.bert.next_sentence.trainable = False
        self.qa_outputs.build([None, None, self.config.hidden_size])
        self.built = True

    def call(self, features, training=False, dropout_seed=None):
        if training and dropout_seed is None:
            dropout_seed = tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
        sequence_output = self.bert.encode(features, training=training, dropout_seed=dropout_seed)   # [B, L, H]
        logits = tf.cast(self.qa_outputs(sequence_output), tf.float32)                           # [B, L, 2]
        length = tf.shape(logits)[1]
        slots = tf.shape(features["cls_positions"])[1]
        row_positions = features["cls_positions"][:, :, None] + tf.range(length)[None, None, :]    # [B, S, L]
        inside_the_row = row_positions < length
        row_positions = tf.minimum(row_positions, length - 1)
        owner = tf.gather(features["sequence_ids"], row_positions, batch_dims=1)                  # [B, S, L]
        own = inside_the_row & (owner == tf.range(1, slots + 1)[None, :, None])
        local = tf.gather(logits, row_positions, batch_dims=1)                                    # [B, S, L, 2]
        local = tf.where(own[..., None], local, OUTSIDE_THE_SEQUENCE)
        return {"start_logits": local[..., 0], "end_logits": local[..., 1]}

    def get_config(self):
        return {"config": self.config.to_dict(), "recompute": self.recompute}

    @classmethod
    def from_config(cls, config):
        return cls(BertConfig(**config["config"]), config.get("recompute", "none"))
