"""Hugging Face BERT directories: the model's weights out to one, and in from one.

A Hugging Face directory is what `transformers.BertForPreTraining.from_pretrained(DIR)` and
keras-hub's `BertBackbone.from_preset(DIR)` read:

    config.json            model_type "bert" and the sizes of bert_config.json
    model.safetensors      the weights, named as transformers' BertForPreTraining names them
    vocab.txt              the WordPiece vocabulary
    tokenizer_config.json  BertTokenizer, with do_lower_case
    special_tokens_map.json

The names follow from the google-research ones (checkpoint.google_variable_names), one to one:

    bert/encoder/layer_3/attention/self/query/kernel  [H, H] -> bert.encoder.layer.3.attention.self.query.weight
    bert/embeddings/LayerNorm/gamma, beta            -> bert.embeddings.LayerNorm.weight, bias
    bert/embeddings/word_embeddings  [V, H]           -> bert.embeddings.word_embeddings.weight
    cls/predictions/output_bias  [V]                  -> cls.predictions.bias
    cls/seq_relationship/output_weights  [2, H]       -> cls.seq_relationship.weight
    output_weights  [C, H] (a fine-tuned classifier)  -> classifier.weight (BertForSequenceClassification)
    cls/squad/output_weights  [2, H] (fine-tuned on spans) -> qa_outputs.weight (BertForQuestionAnswering)

A model trained without the next-sentence head (--nsp_loss=false) has no pooler and no
seq_relationship: its config.json names BertForMaskedLM, which reads it whole.

A dense kernel is [in, out] here and [out, in] in torch.nn.Linear, so it is stored transposed.
The MLM decoder is the word embeddings and its bias `cls.predictions.bias` (transformers ties
both, so neither is stored twice).

Nothing in an exported model depends on packing: positions restart at 0 in every sequence of a
pack and attention never crosses sequences, so each sequence was trained as the standard BERT
computes it alone.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from bert_packed.errors import InternalError, StorageError, raise_if_retryable
from bert_packed.model.checkpoint import (
    CheckpointError,
    does_not_fit,
    export_directory,
    google_variable_names,
    holds_weight,
    load_google_checkpoint,
    refuse_other_content,
    shape_problems,
)
from bert_packed.model.config import BertConfig
from bert_packed.model.modeling import LAYER_NORM_EPSILON, BertEncoder, BertPretrainingModel
from bert_packed.model.task_models import BertClassifierModel, BertQuestionAnsweringModel
from bert_packed.pretraining_data.tokenization import Tokenizer
from bert_packed.storage import files
from bert_packed.storage.output_job import HUGGINGFACE_WEIGHTS

CONFIG_FILE = "config.json"
WEIGHTS_FILE = HUGGINGFACE_WEIGHTS
VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
# What an export writes, config.json last: a directory without it is not a model to any reader.
EXPORT_FILES = (WEIGHTS_FILE, VOCAB_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE, CONFIG_FILE)
# The settings of config.json that decide what the weights compute: an import must agree on each.
MODEL_SETTINGS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "hidden_act", "max_position_embeddings", "type_vocab_size")
_SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                   "mask_token": "[MASK]"}
_RENAMED = {"cls/predictions/output_bias": "cls.predictions.bias",
            "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
            "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
            "output_weights": "classifier.weight", "output_bias": "classifier.bias",
            "cls/squad/output_weights": "qa_outputs.weight", "cls/squad/output_bias": "qa_outputs.bias"}


def huggingface_variable_names(model: BertPretrainingModel) -> list[tuple[str, object, bool]]:
    """(BertForPreTraining name, model weight, stored transposed) for every weight of the model.

    >>> from bert_packed.model import BertConfig, BertPretrainingModel
    >>> model = BertPretrainingModel(BertConfig(vocab_size=8, hidden_size=4, num_hidden_layers=1,
    ...                                         num_attention_heads=1, intermediate_size=8))
    >>> [(name, transposed) for name, _, transposed in huggingface_variable_names(model)][5:7]
    [('bert.encoder.layer.0.attention.self.query.weight', True), ('bert.encoder.layer.0.attention.self.query.bias', False)]
    """
    return [(_huggingface_name(name), weight, transposed or name.endswith("/kernel"))
            for name, weight, transposed in google_variable_names(model)]


def _huggingface_name(google_name: str) -> str:
    if google_name in _RENAMED:
        return _RENAMED[google_name]
    name = re.sub(r"/layer_(\d+)/", r"/layer/\1/", google_name).replace("/", ".")
    if name.endswith("_embeddings"):
        return name + ".weight"
    for old, new in ((".kernel", ".weight"), (".gamma", ".weight"), (".beta", ".bias")):
        if name.endswith(old):
            return name[:-len(old)] + new
    return name


def huggingface_config(bert: BertConfig, next_sentence_prediction: bool = True) -> dict:
    """config.json of a BertForPreTraining with `bert`'s sizes (a BertForMaskedLM without the
    next-sentence head: it has neither pooler nor seq_relationship)."""
    architecture = "BertForPreTraining" if next_sentence_prediction else "BertForMaskedLM"
    return {"architectures": [architecture], "model_type": "bert", **bert.to_dict(),
            "layer_norm_eps": LAYER_NORM_EPSILON, "position_embedding_type": "absolute", "pad_token_id": 0,
            "tie_word_embeddings": True, "dtype": "float32"}


def classifier_config(bert: BertConfig, labels: tuple[str, ...]) -> dict:
    """config.json of a BertForSequenceClassification with `bert`'s sizes: a logit a class of
    `labels`, named by them; no labels: one output, a regression's score."""
    names = labels or ("score",)
    return {**huggingface_config(bert), "architectures": ["BertForSequenceClassification"],
            "num_labels": len(names), "id2label": dict(enumerate(names)),
            "label2id": {name: index for index, name in enumerate(names)},
            "problem_type": "single_label_classification" if labels else "regression"}


def is_huggingface_directory(path: str) -> bool:
    """Whether `path` is a directory with a Hugging Face config.json (else a TF1 checkpoint)."""
    return files.isdir(path) and files.exists(os.path.join(path, CONFIG_FILE))


def export_huggingface(model: BertEncoder | BertPretrainingModel | BertClassifierModel | BertQuestionAnsweringModel,
                       output_dir: str,
                       vocab_file: str, do_lower_case: bool, labels: tuple[str, ...] = ()) -> str:
    """Writes the model as a Hugging Face BERT directory (module docstring); returns `output_dir`.
    A classifier is written as a BertForSequenceClassification of its `labels` (classifier_config),
    a question-answering model as a BertForQuestionAnswering, a BertEncoder alone as a BertModel.

    Each file is written under a temporary name, then renamed; config.json goes last and is
    removed first, so a directory cut short by a kill is never read as a model, and the same
    command again writes it whole. A directory of a previous export is replaced; one that holds
    anything else is refused.

    Raises:
      VocabularyError: the vocabulary is missing or not a BERT one.
      CheckpointError: the vocabulary has more tokens than the model's vocab_size, or
        `output_dir` holds files other than an export's.
    """
    bert = model.config
    if isinstance(model, BertClassifierModel) and max(len(labels), 1) != model.num_outputs:
        raise InternalError(f"a classifier of {model.num_outputs} outputs exported with {len(labels)} labels")
    tokenizer = _vocabulary(vocab_file, do_lower_case, bert)
    with export_directory(output_dir, _exported) as confirm:
        if files.exists(os.path.join(output_dir, CONFIG_FILE)):
            files.remove(os.path.join(output_dir, CONFIG_FILE))
        _write_weights(model, os.path.join(output_dir, WEIGHTS_FILE))
        with files.open_file(tokenizer.vocab_file, "rb") as source:
            vocabulary = source.read()
        with files.atomic_open(os.path.join(output_dir, VOCAB_FILE), "wb") as f:
            f.write(vocabulary)
        tokenizer_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case,
                            "strip_accents": None, "tokenize_chinese_chars": True,
                            "model_max_length": bert.max_position_embeddings, **_SPECIAL_TOKENS}
        for name, values in ((TOKENIZER_CONFIG_FILE, tokenizer_config), (SPECIAL_TOKENS_FILE, _SPECIAL_TOKENS)):
            files.write_text_atomically(os.path.join(output_dir, name), json.dumps(values, indent=2) + "\n")
        confirm()
        if isinstance(model, BertClassifierModel):
            config = classifier_config(bert, labels)
        elif isinstance(model, BertQuestionAnsweringModel):
            config = {**huggingface_config(bert), "architectures": ["BertForQuestionAnswering"]}
        elif isinstance(model, BertEncoder):  # the encoder alone: transformers' BertModel
            config = {**huggingface_config(bert), "architectures": ["BertModel"]}
        else:
            config = huggingface_config(bert, model.next_sentence_prediction)
        files.write_text_atomically(os.path.join(output_dir, CONFIG_FILE), json.dumps(config, indent=2) + "\n")
    return output_dir


def _vocabulary(vocab_file: str, do_lower_case: bool, bert: BertConfig) -> Tokenizer:
    """The export's tokenizer, refused when its vocabulary cannot be the model's."""
    tokenizer = Tokenizer(vocab_file, do_lower_case)
    if tokenizer.vocab_size > bert.vocab_size:
        raise CheckpointError(f"{vocab_file}: {tokenizer.vocab_size:,} tokens, but the model's vocab_size is "
                              f"{bert.vocab_size:,}: not the vocabulary it is trained with")
    return tokenizer


def _exported(name: str) -> bool:
    return name in EXPORT_FILES


def require_export_directory(output_dir: str, vocab_file: str, do_lower_case: bool, bert: BertConfig,
                             run_dir: str) -> None:
    """What export_huggingface would refuse, checked before the run `run_dir` that ends with one.

    Raises:
      VocabularyError / CheckpointError / OutputDirectoryError: as export_huggingface; or the
        directory is in the run's, or takes no file.
    """
    _vocabulary(vocab_file, do_lower_case, bert)
    inside = os.path.relpath(files.absolute(output_dir), files.absolute(run_dir)) if "://" not in output_dir else ".."
    if not inside.startswith(".."):
        raise CheckpointError(f"{output_dir}: in the run's --output_dir; export to a directory of its own")
    refuse_other_content(output_dir, _exported)
    try:  # a directory that takes no file is found now, not after the training
        files.makedirs(output_dir)
        probe = os.path.join(output_dir, f".write-check-{os.getpid()}")
        files.write_text_atomically(probe, "")
        files.remove(probe)
    except StorageError as e:
        raise_if_retryable(e)
        raise CheckpointError(f"--export_huggingface_dir: {e}; give an --export_huggingface_dir this process may "
                              f"write to") from None


def _write_weights(model: BertPretrainingModel, path: str) -> None:
    from safetensors.numpy import save

    tensors = {}
    for name, weight, transposed in huggingface_variable_names(model):
        value = np.asarray(weight.numpy(), dtype=np.float32)
        tensors[name] = np.ascontiguousarray(value.T if transposed else value)
    with files.atomic_open(path, "wb") as f:
        f.write(save(tensors, metadata={"format": "pt"}))  # transformers reads safetensors marked "pt"


def require_same_model(directory: str, bert: BertConfig) -> None:
    """Refuses a Hugging Face directory whose config.json differs from `bert` in what the weights
    compute (MODEL_SETTINGS, the layer norm's epsilon, absolute positions). Dropout and the
    initializer range may differ: they are not in the weights.

    Raises:
      CheckpointError: naming the first setting that differs, its value there and here.
    """
    path = os.path.join(directory, CONFIG_FILE)
    try:
        with files.open_file(path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise_if_retryable(e)
        raise CheckpointError(f"{path}: cannot read it as a Hugging Face config ({e})") from None
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        model_type = config.get("model_type") if isinstance(config, dict) else None
        raise CheckpointError(f"{path}: model_type {model_type!r}, not a BERT model ('bert')")
    expected = {**{name: getattr(bert, name) for name in MODEL_SETTINGS}, "layer_norm_eps": LAYER_NORM_EPSILON,
                "position_embedding_type": "absolute"}
    defaults = {"hidden_act": "gelu", "layer_norm_eps": 1e-12, "position_embedding_type": "absolute",
                "type_vocab_size": 2}  # what transformers' BertConfig takes when config.json leaves them out
    for name, value in expected.items():
        found = config.get(name, defaults.get(name))
        if found != value:
            raise CheckpointError(f"{path}: {name}={found!r}, but --bert_config_file says {name}={value!r}")


def load_huggingface(model: BertEncoder | BertPretrainingModel | BertClassifierModel | BertQuestionAnsweringModel,
                     directory: str) -> int:
    """Loads a Hugging Face BERT directory's weights into the model: a BertForPreTraining's
    (transformers' names, with or without the `bert.` prefix; LayerNorm's gamma and beta as older
    files name them are read too). Into a BertEncoder (a fine-tuning model's), the encoder's
    alone: heads in the file, pre-training's or another task's, are passed over (a fine-tuned
    classifier's weights start a SQuAD run).

    Args:
      model: the model.
      directory: the Hugging Face directory.

    Returns:
      The number of weights loaded (all of the model's).

    Raises:
      CheckpointError: config.json differs from the model's config (require_same_model), no
        model.safetensors, listing every missing or mismatched weight, or naming tensors the
        model does not have (_unused_tensors).
    """
    require_same_model(directory, model.config)
    path = os.path.join(directory, WEIGHTS_FILE)
    if not files.exists(path):
        other = [name for name in files.listdir(directory) if name.endswith((".bin", ".h5", ".index.json"))]
        raise CheckpointError(f"{path}: not found" + (f" ({other[0]} is there: save the model as one safetensors "
                                                      f"file)" if other else ""))
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        with files.open_file(path, "rb") as f:
            stored = load(f.read())
    except SafetensorError as e:
        raise CheckpointError(f"{path}: cannot read it as safetensors ({e}): cut short or damaged") from None
    tensors = {_canonical(name): value for name, value in stored.items()}
    names = huggingface_variable_names(model)
    if isinstance(model, BertEncoder):
        tensors = {name: value for name, value in tensors.items() if not name.startswith(("cls.", *TASK_HEADS))}
    problems = shape_problems(names, {name: value.shape for name, value in tensors.items()})
    if problems:
        raise does_not_fit(path, problems)
    unused = _unused_tensors(tensors, {name for name, _, _ in names}, _next_sentence_prediction(model))
    if unused:
        originals = {_canonical(name): name for name in stored}
        raise CheckpointError(f"{path}: holds {len(unused)} tensor{'s' if len(unused) != 1 else ''} the model does not have ("
                              f"{', '.join(originals[name] for name in unused[:3])}{', ...' if unused[3:] else ''}): "
                              f"another model's weights; give a BertForPreTraining or BertForMaskedLM directory")
    for name, weight, transposed in names:
        weight.assign(tensors[name].T if transposed else tensors[name])
    return len(names)


# Fine-tuning heads (transformers' BertForSequenceClassification's, BertForQuestionAnswering's).
TASK_HEADS = ("classifier.", "qa_outputs.")

# Tensors a BertForPreTraining file may hold beside the model's weights: tied copies, saved by
# older transformers, and what they copy.
_TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
         "cls.predictions.decoder.bias": "cls.predictions.bias"}


def _unused_tensors(tensors: dict[str, np.ndarray], wanted: set[str], next_sentence_prediction: bool) -> list[str]:
    """The tensors (canonical names) that loading would leave unread and that are not known to be
    nothing lost: older transformers' position_ids buffer, a tied copy equal to what it copies,
    the next-sentence head of a model trained without one (--nsp_loss=false)."""
    unused = []
    for name in sorted(set(tensors) - wanted):
        copied = _TIED.get(name)
        if name == "bert.embeddings.position_ids" or (copied in tensors and np.array_equal(tensors[name],
                                                                                           tensors[copied])):
            continue
        if not next_sentence_prediction and name.startswith(("bert.pooler.", "cls.seq_relationship.")):
            continue
        unused.append(name)
    return unused


def _next_sentence_prediction(model) -> bool:
    """Whether the model reads the next-sentence head's weights (the pooler, for an encoder)."""
    if isinstance(model, BertEncoder):
        return model.pooler is not None
    return getattr(model, "next_sentence_prediction", True)


def _canonical(name: str) -> str:
    """A stored name as huggingface_variable_names spells it: a bare BertModel's names under
    `bert.` (a fine-tuned head keeps its `classifier.` or `qa_outputs.`), LayerNorm's gamma and
    beta as weight and bias."""
    if not name.startswith(("bert.", "cls.", "classifier.", "qa_outputs.")):
        name = "bert." + name
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def holds_classifier(path: str, unreadable: bool = True) -> bool:
    """Whether weights from outside a run (load_weights' `path`) are a fine-tuned classifier's: a
    Hugging Face BertForSequenceClassification directory, or a TF1 checkpoint holding
    google-research's run_classifier output_weights (`unreadable` when it cannot be read)."""
    if not is_huggingface_directory(path):
        return holds_weight(path, "output_weights", unreadable)
    return "BertForSequenceClassification" in (_architectures(path) or [])


def holds_span_head(path: str, unreadable: bool = True) -> bool:
    """Whether weights from outside a run (load_weights' `path`) are fine-tuned on spans: a Hugging
    Face BertForQuestionAnswering directory, or a TF1 checkpoint holding google-research's
    run_squad cls/squad/output_weights (`unreadable` when it cannot be read)."""
    if not is_huggingface_directory(path):
        return holds_weight(path, "cls/squad/output_weights", unreadable)
    return "BertForQuestionAnswering" in (_architectures(path) or [])


def holds_pooler(path: str) -> bool:
    """Whether weights from outside a run (load_weights' `path`) include the pooler: a Hugging Face
    directory's model.safetensors lists bert.pooler (its header read, not its tensors), a TF1
    checkpoint holds bert/pooler. What cannot be read says True: loading it then names the problem;
    a request the storage still failed after retrying is raised as it is (the command's status 75)."""
    if not is_huggingface_directory(path):
        return holds_weight(path, "bert/pooler/dense/kernel")
    try:
        with files.open_file(os.path.join(path, WEIGHTS_FILE), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    except (OSError, ValueError) as e:
        raise_if_retryable(e)
        return True
    return any(_canonical(name) == "bert.pooler.dense.weight" for name in header)


def holds_next_sentence_head(path: str) -> bool:
    """Whether weights from outside a run (load_weights' `path`) include the next-sentence head:
    a Hugging Face directory's config.json names no BertForMaskedLM, a TF1 checkpoint holds
    cls/seq_relationship. What cannot be read says True: loading it then names the problem."""
    if not is_huggingface_directory(path):
        return holds_weight(path, "cls/seq_relationship/output_weights")
    return "BertForMaskedLM" not in (_architectures(path) or [])


def _architectures(directory: str) -> list | None:
    """The architectures a Hugging Face directory's config.json names ([] when none; None when it
    cannot be read as a JSON object: loading it then names the problem)."""
    try:
        with files.open_file(os.path.join(directory, CONFIG_FILE)) as f:
            return json.load(f).get("architectures") or []
    except (ValueError, AttributeError):
        return None


def load_weights(model: BertEncoder | BertPretrainingModel | BertClassifierModel | BertQuestionAnsweringModel,
                 path: str) -> int:
    """Loads weights from outside a run into the model: a Hugging Face BERT directory (checked
    against the model's config) or a google-research/MLPerf TF1 checkpoint. Into a BertEncoder,
    the encoder's alone, whatever heads the weights have.

    Returns:
      The number of weights loaded (all of the model's).

    Raises:
      CheckpointError: naming what does not fit.
    """
    if is_huggingface_directory(path):
        return load_huggingface(model, path)
    return load_google_checkpoint(model, path)
