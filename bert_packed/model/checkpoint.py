"""google-research/bert and MLPerf TF1 checkpoints: import into the model, export from it.

The TF1 names (bert/embeddings/word_embeddings, bert/encoder/layer_0/attention/self/query/kernel,
..., cls/predictions/output_bias, cls/seq_relationship/output_weights) map one to one onto the
model's weights, but for query, key and value: each is a third of the fused projection's columns
(Part). Dense kernels are [in, out] in both; cls/seq_relationship/output_weights is
stored [2, H], the transpose of the classifier's kernel. Optimizer slots and other variables in
a checkpoint are ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from bert_packed.errors import UserError, raise_if_retryable
from bert_packed.model.modeling import BertEncoder, BertPretrainingModel
from bert_packed.model.task_models import BertClassifierModel, BertQuestionAnsweringModel
from bert_packed.storage import files
from bert_packed.storage.output_job import (
    EXPORT_UNDER_WAY,
    EXPORTED_MODEL,
    GOOGLE_CHECKPOINT,
    GOOGLE_CONFIG,
    claimed,
    found_output,
    refuse_other_output,
)


class CheckpointError(UserError, ValueError):
    """A checkpoint does not hold every model weight with the right shape, or cannot be read."""


class Part:
    """Columns of a weight (its last axis), read and written as a weight of its own: the query, key
    and value thirds of a fused [H, 3H] projection keep their names in every file format."""

    def __init__(self, weight, columns: slice):
        self.weight, self.columns = weight, columns
        self.shape = (*weight.shape[:-1], columns.stop - columns.start)

    def numpy(self) -> np.ndarray:
        return self.weight.numpy()[..., self.columns]

    def assign(self, value) -> None:
        whole = self.weight.numpy()
        whole[..., self.columns] = value
        self.weight.assign(whole)


def google_variable_names(model: BertEncoder | BertPretrainingModel | BertClassifierModel | BertQuestionAnsweringModel
                          ) -> list[tuple[str, object, bool]]:
    """(TF1 name, model weight, stored transposed) for every weight of the model: its encoder's
    (bert/..., bert/pooler where it has one), then its heads': pre-training's cls/predictions and
    cls/seq_relationship, a classifier's as google-research's run_classifier names them
    (output_weights [C, H], output_bias), a span model's as run_squad does
    (cls/squad/output_weights [2, H], output_bias)."""
    if not model.built:
        model.build()
    if isinstance(model, BertClassifierModel):
        return google_variable_names(model.encoder) + [
            ("output_weights", model.classifier.kernel, True), ("output_bias", model.classifier.bias, False)]
    if isinstance(model, BertQuestionAnsweringModel):
        return google_variable_names(model.encoder) + [
            ("cls/squad/output_weights", model.qa_outputs.kernel, True),
            ("cls/squad/output_bias", model.qa_outputs.bias, False)]
    names = []

    def dense(prefix, layer):
        names.extend([(f"{prefix}/kernel", layer.kernel, False), (f"{prefix}/bias", layer.bias, False)])

    def layer_norm(prefix, layer):
        names.extend([(f"{prefix}/gamma", layer.gamma, False), (f"{prefix}/beta", layer.beta, False)])

    if isinstance(model, BertPretrainingModel):
        names += google_variable_names(model.encoder)
        dense("cls/predictions/transform/dense", model.masked_lm.transform)
        layer_norm("cls/predictions/transform/LayerNorm", model.masked_lm.layer_norm)
        names.append(("cls/predictions/output_bias", model.masked_lm.output_bias, False))
        if model.next_sentence is not None:
            names += [("cls/seq_relationship/output_weights", model.next_sentence.kernel, True),
                      ("cls/seq_relationship/output_bias", model.next_sentence.bias, False)]
        return names
    embeddings = model.embeddings
    names += [("bert/embeddings/word_embeddings", embeddings.word_embeddings, False),
              ("bert/embeddings/position_embeddings", embeddings.position_embeddings, False),
              ("bert/embeddings/token_type_embeddings", embeddings.token_type_embeddings, False)]
    layer_norm("bert/embeddings/LayerNorm", embeddings.layer_norm)
    for i, layer in enumerate(model.encoder_layers):
        prefix = f"bert/encoder/layer_{i}"
        for index, name in enumerate(("query", "key", "value")):  # the fused kernel's thirds
            columns = slice(index * model.config.hidden_size, (index + 1) * model.config.hidden_size)
            names.extend([(f"{prefix}/attention/self/{name}/kernel", Part(layer.query_key_value.kernel, columns), False),
                          (f"{prefix}/attention/self/{name}/bias", Part(layer.query_key_value.bias, columns), False)])
        dense(f"{prefix}/attention/output/dense", layer.attention_output)
        layer_norm(f"{prefix}/attention/output/LayerNorm", layer.attention_layer_norm)
        dense(f"{prefix}/intermediate/dense", layer.intermediate)
        dense(f"{prefix}/output/dense", layer.output_dense)
        layer_norm(f"{prefix}/output/LayerNorm", layer.output_layer_norm)
    if model.pooler is not None:
        dense("bert/pooler/dense", model.pooler)
    return names


def load_google_checkpoint(model: BertEncoder | BertPretrainingModel | BertClassifierModel | BertQuestionAnsweringModel,
                           path: str) -> int:
    """Loads a google-research/bert or MLPerf TF1 checkpoint into the model.

    Args:
      model: the model (built on first use); into a BertEncoder (a fine-tuning model's) the
        encoder's weights alone are read, whatever heads the checkpoint has.
      path: checkpoint prefix (".../model.ckpt-28252") or a directory with a `checkpoint` file.

    Returns:
      The number of weights loaded.

    Raises:
      CheckpointError: unreadable, a run's own training checkpoint (checkpoints/ckpt-N, said so),
        or listing every missing or mismatched weight.
    """
    with files.unglobbed(_prefix(path)) as readable:
        try:
            reader = tf.train.load_checkpoint(readable)
        except (tf.errors.OpError, ValueError) as e:
            raise_if_retryable(files.storage_error(e, path))
            raise CheckpointError(f"{path}: cannot read the checkpoint: {str(e).splitlines()[0]}") from None
        if reader.has_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"):  # TensorFlow's object-based names: a run's own
            raise CheckpointError(f"{path}: a run's training checkpoint (it resumes that run); give the run's "
                                  f"exported model.ckpt-N, which a finished run writes, and scripts/export_model.py "
                                  f"--checkpoint={path} --format=tf1 (with --bert_config_file and --output_dir) "
                                  f"writes from this one")
        return _load(model, path, reader)


def _prefix(path: str) -> str:
    """A checkpoint's prefix: `path` (a prefix, or one of its files: model.ckpt-N.index), or for a
    directory the checkpoint its state file names."""
    if not files.isdir(path):
        return re.sub(r"\.(index|data-\d+-of-\d+)$", "", path)
    state = tf.train.get_checkpoint_state(path)
    if state is None or not state.model_checkpoint_path:
        newest = newest_exported_step(path)
        if newest is not None:  # an export's directory (--format=tf1) has no state file
            return os.path.join(path, f"model.ckpt-{newest}")
        if files.exists(os.path.join(path, "model.safetensors")):
            raise CheckpointError(f"{path}: model.safetensors without the config.json of a Hugging Face directory")
        raise CheckpointError(f"{path}: a directory without a `checkpoint` state file naming a checkpoint, or a "
                              f"model.ckpt-N")
    named = state.model_checkpoint_path
    return named if os.path.isabs(named) or "://" in named else os.path.join(path, os.path.basename(named))


def copy_weights(source, target) -> None:
    """Gives each weight of the model `target` the value of `source`'s of the same google-research
    name (google_variable_names): one `source` lacks keeps its value."""
    theirs = {name: weight for name, weight, _ in google_variable_names(source)}
    for name, weight, _ in google_variable_names(target):
        if name in theirs:
            weight.assign(theirs[name].numpy())


def holds_weight(path: str, name: str, unreadable: bool = True) -> bool:
    """Whether the TF1 checkpoint at `path` (a prefix, or a directory) holds the weight `name`;
    `unreadable` when it cannot be read (True: loading it then names the problem). A request the
    storage still failed after retrying is raised as that StorageError (the command's status 75)."""
    try:
        with files.unglobbed(_prefix(path)) as readable:  # a path holding [ or * is a pattern to TensorFlow
            return tf.train.load_checkpoint(readable).has_tensor(name)
    except (CheckpointError, tf.errors.OpError, ValueError) as e:
        raise_if_retryable(files.storage_error(e, path))
        return unreadable


def newest_exported_step(directory: str) -> int | None:
    """The step of the newest `model.ckpt-N` in `directory` (a finished run's, or an export's);
    None when there is none."""
    found = (re.match(r"^model\.ckpt-(\d+)\.index$", name) for name in files.listdir(directory))
    return max((int(match.group(1)) for match in found if match), default=None)


def checkpoint_step(path: str) -> int:
    """The training step a TF1 checkpoint was saved at: its `global_step` tensor, or else the
    number its name ends with (`model.ckpt-28252`), or else 0."""
    try:
        with files.unglobbed(_prefix(path)) as readable:
            reader = tf.train.load_checkpoint(readable)
            if reader.has_tensor("global_step"):
                return int(reader.get_tensor("global_step"))
    except (tf.errors.OpError, ValueError, CheckpointError) as e:
        raise_if_retryable(files.storage_error(e, path))
    match = re.search(r"-(\d+)$", path.rstrip("/"))
    return int(match.group(1)) if match else 0


def shape_problems(names: list[tuple[str, object, bool]], shapes: dict) -> list[str]:
    """Each weight of `names` ((name, weight, stored transposed)) missing from `shapes` (stored
    name -> shape) or stored in another shape, in words."""
    problems, missing = [], []
    for name, weight, transposed in names:
        expected = tuple(weight.shape[::-1] if transposed else weight.shape)
        if name not in shapes:
            problems.append(f"missing {name} {list(expected)}")
            missing.append(name)
        elif tuple(shapes[name]) != expected:
            problems.append(f"{name} has shape {list(shapes[name])}, the model needs {list(expected)}")
    if missing and len(missing) == len(problems) and all(re.search(r"pooler|seq_relationship", n) for n in missing):
        return ["no next-sentence head (pooler, seq_relationship): weights trained with --nsp_loss=false; give "
                "--nsp_loss=false to train or evaluate them"]
    return problems


def does_not_fit(path: str, problems: list[str]) -> CheckpointError:
    """The refusal of weights that do not fit a model: its first problems, in one line."""
    shown = "; ".join(problems[:2]) + (f"; and {len(problems) - 2} more" if problems[2:] else "")
    return CheckpointError(f"{path}: does not fit the model ({len(problems)} problem{'s' * (len(problems) != 1)}): "
                           f"{shown}")


def _load(model, path: str, reader) -> int:
    names = google_variable_names(model)
    stored = reader.get_variable_to_shape_map()
    problems = shape_problems(names, stored)
    layers = {int(found[1]) for found in map(re.compile(r"^bert/encoder/layer_(\d+)/").match, stored) if found}
    if len(layers) > model.config.num_hidden_layers:  # each of the model's would load, the rest left unread
        problems.append(f"it holds {len(layers)} layers (bert/encoder/layer_N), the model "
                        f"{model.config.num_hidden_layers} (num_hidden_layers of its BERT config)")
    if problems:
        raise does_not_fit(path, problems)
    values = []
    for name, _, _ in names:  # every value read before any is assigned: a torn file changes nothing
        try:
            values.append(reader.get_tensor(name))
        except (tf.errors.OpError, IndexError) as e:  # TensorFlow's reader says "Read less bytes" by IndexError
            raise_if_retryable(files.storage_error(e, path))
            raise CheckpointError(f"{path}: cannot read {name} ({str(e).splitlines()[0]}): the checkpoint is cut "
                                  f"short or damaged") from None
    for (_, weight, transposed), value in zip(names, values):
        weight.assign(value.T if transposed else value)
    return len(names)


def export_google_checkpoint(model: BertPretrainingModel, path: str, step: int | None = None) -> str:
    """Writes the model's weights as a TF1 checkpoint with google-research names (and `global_step`,
    as TF1 BERT checkpoints carry it, when `step` is given).

    Returns:
      The checkpoint prefix (`path`), loadable by load_google_checkpoint and by TF1 BERT tools.
    """
    names, tensors = [], []
    for name, weight, transposed in google_variable_names(model):
        value = np.asarray(weight.numpy(), dtype=np.float32)
        names.append(name)
        tensors.append(tf.constant(value.T if transposed else value))
    if step is not None:
        names.append("global_step")
        tensors.append(tf.constant(step, tf.int64))
    # One temporary name, not one a process: what a writer killed midway left (SaveV2's own
    # `.tempstate` files among it) is removed before and after (the trainer's lock keeps two from
    # writing here at once).
    tmp = f"{path}.tmp"
    _remove_parts(tmp)
    try:
        tf.raw_ops.SaveV2(prefix=tmp, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors)
        for suffix in (".data-00000-of-00001", ".index"):  # the index last: a reader finds all or none
            files.move(tmp + suffix, path + suffix)
    finally:
        _remove_parts(tmp)
    return path


def refuse_other_content(output_dir: str, exported: Callable[[str], bool]) -> None:
    """Refuses an export's output directory that holds another kind of output (refuse_other_output),
    what no export of its format (`exported` names) wrote, or such names without an export
    (output_job.found_output): a vocabulary's directory (vocab.txt, bert_config.json), which the
    export would write over."""
    if files.exists(output_dir) and not files.isdir(output_dir):
        raise CheckpointError(f"{output_dir}: a file, not a directory for the exported model")
    ancestor = os.path.dirname(output_dir.rstrip("/"))
    while ancestor and not ancestor.endswith(":/") and ancestor != "/" and not files.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if ancestor and not ancestor.endswith(":/") and files.exists(ancestor) and not files.isdir(ancestor):
        raise CheckpointError(f"{output_dir}: under {ancestor}, a file, not a directory")
    refuse_other_output(output_dir, EXPORTED_MODEL)
    is_export = found_output(output_dir) == EXPORTED_MODEL
    names = [name for name in files.listdir(output_dir)
             if name not in (".lock", EXPORT_UNDER_WAY) and not files.is_temporary_name(name)]
    other = [name for name in names if not exported(name)]
    if other:
        more = f" and {len(other) - 1} more" if len(other) > 1 else ""
        what = "which an export of this format does not write (another format's, or your own)" if is_export \
            else "not an exported model"
        raise CheckpointError(f"{output_dir}: holds {other[0]}{more}, {what}; use an empty or new directory")
    if names and not is_export:
        raise CheckpointError(f"{output_dir}: holds {' and '.join(sorted(names))} but no exported model, which "
                              f"would write over {'them' if len(names) > 1 else 'it'}; use an empty or new directory")


@contextlib.contextmanager
def export_directory(output_dir: str, exported: Callable[[str], bool]):
    """Holds `output_dir` for an export, as every kind of output is held (output_job.claimed:
    made, locked, leftovers of a killed export removed); yields its confirm. A directory of a
    previous export (only names `exported` accepts) is written over; one that holds another kind
    of output, or anything else, is refused, before the directory is made. Until the block ends,
    the directory is marked as an export under way: one killed after removing the export it
    writes over is still an export (the same command writes it; another kind is refused).

    Raises:
      OutputDirectoryError: naming the kind of output it holds (a dataset, a training run).
      CheckpointError: naming what else it holds.
    """
    refuse_other_content(output_dir, exported)
    with claimed(output_dir, "export_model", EXPORTED_MODEL) as confirm:
        refuse_other_content(output_dir, exported)
        under_way = os.path.join(output_dir, EXPORT_UNDER_WAY)
        files.write_text_atomically(under_way, "export_model\n")
        yield confirm
        files.remove(under_way)


def export_google_directory(model: BertPretrainingModel, output_dir: str, vocab_file: str, step: int) -> str:
    """Writes the model as google-research/bert released it: `model.ckpt-STEP` (TF1 names),
    bert_config.json and vocab.txt, in `output_dir`; returns the checkpoint prefix. The
    checkpoint's index goes last: a directory cut short by a kill holds no readable checkpoint.

    Raises:
      CheckpointError: `output_dir` holds something else.
    """
    names = (GOOGLE_CONFIG, "vocab.txt")
    with export_directory(output_dir, lambda name: name in names or name.startswith(GOOGLE_CHECKPOINT)) as confirm:
        # An earlier export's checkpoint goes first (its index first): a kill never leaves an old
        # checkpoint beside a new bert_config.json.
        for name in sorted(files.listdir(output_dir), key=lambda name: not name.endswith(".index")):
            if name.startswith(GOOGLE_CHECKPOINT):
                files.remove(os.path.join(output_dir, name))
        with files.open_file(vocab_file, "rb") as f:
            vocabulary = f.read()
        with files.atomic_open(os.path.join(output_dir, "vocab.txt"), "wb") as f:
            f.write(vocabulary)
        files.write_text_atomically(os.path.join(output_dir, GOOGLE_CONFIG),
                                    json.dumps(model.config.to_dict(), indent=2) + "\n")
        confirm()
        return export_google_checkpoint(model, os.path.join(output_dir, f"{GOOGLE_CHECKPOINT}{step}"), step)


def _remove_parts(prefix: str) -> None:
    directory, name = os.path.split(prefix)
    directory = directory or "."
    for part in files.listdir(directory) if files.isdir(directory) else ():
        if part.startswith(name + "."):
            files.remove(os.path.join(directory, part))
