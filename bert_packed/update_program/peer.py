"""The peer: the same padded sequences trained by Hugging Face transformers' BertForPreTraining
(PyTorch), timed on the same device, so that a figure of ours is held against a well-known
implementation's.

Its own defaults, as a user of transformers would train: its default attention (PyTorch's
scaled_dot_product_attention), AdamW, and on a GPU bf16 autocast over float32 weights (what our
bf16 is); the masked-LM loss over the predicted tokens and the next-sentence loss. One padded
row of ours is one row of its: input_ids, token_type_ids (our segment_ids), attention_mask (our
sequence_ids > 0), labels at the predicted positions (-100 elsewhere), next_sentence_label.
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def peer_inputs(features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """BertForPreTraining's inputs of a padded micro-batch of ours (one sequence a row).

    >>> features = {"input_ids": np.array([[101, 103, 7, 102, 0]]), "segment_ids": np.zeros((1, 5), int),
    ...             "sequence_ids": np.array([[1, 1, 1, 1, 0]]), "masked_lm_positions": np.array([[1, 0]]),
    ...             "masked_lm_ids": np.array([[42, 0]]), "prediction_sequence_ids": np.array([[1, 0]]),
    ...             "next_sentence_labels": np.array([[1]])}
    >>> inputs = peer_inputs(features)
    >>> inputs["labels"].tolist(), inputs["attention_mask"].tolist(), inputs["next_sentence_label"].tolist()
    ([[-100, 42, -100, -100, -100]], [[1, 1, 1, 1, 0]], [1])
    """
    rows, length = features["input_ids"].shape
    labels = np.full((rows, length), -100, np.int64)
    row, slot = np.nonzero(features["prediction_sequence_ids"] > 0)
    labels[row, features["masked_lm_positions"][row, slot]] = features["masked_lm_ids"][row, slot]
    return {"input_ids": features["input_ids"].astype(np.int64), "token_type_ids": features["segment_ids"].astype(np.int64),
            "attention_mask": (features["sequence_ids"] > 0).astype(np.int64), "labels": labels,
            "next_sentence_label": features["next_sentence_labels"][:, 0].astype(np.int64)}


class PeerStep:
    """BertForPreTraining's training step (forward, backward, AdamW) on one padded micro-batch of
    ours, built and ready: step() runs one and returns its loss once the device is done.

    Args:
      bert: the BERT config (google-research's keys).
      features: a padded micro-batch of ours (the model's feature dict, NumPy).
      bf16: autocast the products to bf16 (on a GPU).

    Attributes:
      device: the device's name; attention: the attention implementation transformers chose;
      rows, real_tokens: what one step trains on.
    """

    def __init__(self, bert: dict, features: dict[str, np.ndarray], bf16: bool):
        import torch
        import transformers

        self._torch = torch
        on_gpu = torch.cuda.is_available()
        self._where = "cuda" if on_gpu else "cpu"
        self.bf16 = bf16
        config = transformers.BertConfig(**{k: v for k, v in bert.items() if k != "directionality"})
        self._model = transformers.BertForPreTraining(config).to(self._where).train()
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=1e-4)
        self._inputs = {name: torch.from_numpy(value).to(self._where) for name, value in peer_inputs(features).items()}
        self.device = torch.cuda.get_device_name() if on_gpu else "CPU"
        self.attention = self._model.config._attn_implementation
        self.rows, self.real_tokens = len(features["input_ids"]), int((features["sequence_ids"] > 0).sum())

    def step(self) -> float:
        torch = self._torch
        with torch.autocast(self._where, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self._model(**self._inputs).loss
        loss.backward()
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())  # waits for the device


def time_peer(bert: dict, features: dict[str, np.ndarray], warmup: int, calls: int, bf16: bool) -> dict:
    """Times PeerStep's steps: `warmup` untimed, then `calls` timed.

    Returns:
      {"device", "attention", "rows", "bf16", "seconds", "median_seconds", "sequences_per_second",
      "real_tokens_per_second", "loss"}.
    """
    peer = PeerStep(bert, features, bf16)
    for _ in range(warmup):
        peer.step()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        loss = peer.step()
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {"device": peer.device, "attention": peer.attention, "rows": peer.rows, "bf16": bf16, "seconds": seconds,
            "median_seconds": median, "sequences_per_second": peer.rows / median,
            "real_tokens_per_second": peer.real_tokens / median, "loss": loss}
