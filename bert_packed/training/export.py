"""export_model as a function of its settings: pre-trained weights written where users fine-tune,
a Hugging Face directory or a google-research TF1 checkpoint (docs/model.md, "After
pre-training").

    from bert_packed.model.config import ExportSettings
    from bert_packed.training.export import export_model

    exported = export_model(ExportSettings(checkpoint="runs/wikipedia_like/packed_batch_corrected_seed1",
                                           bert_config_file="configs/bert_config_tiny.json",
                                           output_dir="runs/wikipedia_like/hf_model"))
    exported.written
"""

from __future__ import annotations

import dataclasses

from bert_packed.errors import SettingsError
from bert_packed.model.config import ExportSettings
from bert_packed.pretraining_data.tokenization import vocabulary_path
from bert_packed.storage import files
from bert_packed.storage.run_directory import RunDirectory, program_of


@dataclasses.dataclass(frozen=True)
class Exported:
    """What export_model wrote.

    Attributes:
      source: the weights read (a checkpoint's path).
      step: their training step.
      written: the directory (Hugging Face) or checkpoint prefix (TF1) written.
      format: "huggingface" or "tf1".
    """

    source: str
    step: int
    written: str
    format: str


def export_model(settings: ExportSettings) -> Exported:
    """Writes the pre-trained weights of settings.checkpoint (a run directory's newest, a TF1
    checkpoint, a Hugging Face directory) as settings.format into settings.output_dir.

    Raises:
      UserError: weights, a config or a vocabulary that cannot be exported (a fine-tuned run's:
        its own command exports it with --export_huggingface_dir), in one line.
    """
    from bert_packed.model import BertConfig
    from bert_packed.pretraining_data.tokenization import Tokenizer

    bert = BertConfig.from_json_file(settings.bert_config_file)
    vocab_file = vocabulary_path(settings.vocab_file)
    Tokenizer(vocab_file, settings.do_lower_case)  # a missing or foreign vocabulary: before any work
    from bert_packed.model import BertPretrainingModel, export_huggingface
    from bert_packed.model.checkpoint import checkpoint_step, export_google_directory
    from bert_packed.model.huggingface import load_weights
    from bert_packed.training.checkpoints import load_run_weights, run_and_step

    if files.absolute(settings.output_dir.rstrip("/")) == files.absolute(settings.checkpoint.rstrip("/")):
        raise SettingsError(f"--output_dir={settings.output_dir}: the --checkpoint itself; export to another "
                            f"directory")
    run_dir, step = run_and_step(settings.checkpoint)
    model = BertPretrainingModel(bert, _next_sentence_head(settings.checkpoint, run_dir))
    model.build()
    if run_dir is not None:
        source, step = load_run_weights(model, run_dir, step)
    else:
        load_weights(model, settings.checkpoint)
        source, step = settings.checkpoint, checkpoint_step(settings.checkpoint)
    if settings.format == "huggingface":
        written = export_huggingface(model, settings.output_dir, vocab_file, settings.do_lower_case)
    else:
        written = export_google_directory(model, settings.output_dir, vocab_file, step)
    return Exported(source, step, written, settings.format)


def _next_sentence_head(checkpoint: str, run_dir: str | None) -> bool:
    """Whether the pre-trained weights of `checkpoint` carry the next-sentence head (a run trained
    with --nsp_loss=false, as its run.json says, or weights without it, do not); fine-tuned
    weights (a task's head) are refused: this command writes pre-training's heads."""
    from bert_packed.model.huggingface import holds_classifier, holds_next_sentence_head, holds_span_head

    fine_tuned = program_of(RunDirectory(run_dir).read_info()) if run_dir is not None else "run_pretraining"
    if fine_tuned != "run_pretraining":
        raise SettingsError(f"--checkpoint={checkpoint}: a {fine_tuned} run; it exports with its own head: run the "
                            f"same {fine_tuned} command with --export_huggingface_dir=DIR (a finished run exports at "
                            f"once, nothing trained again)")
    if run_dir is None and (holds_classifier(checkpoint, unreadable=False)  # unreadable: loading says why
                            or holds_span_head(checkpoint, unreadable=False)):
        raise SettingsError(f"--checkpoint={checkpoint}: fine-tuned weights (a task's head); this command writes "
                            f"pre-training's heads: a fine-tuning run exports with its own, its command with "
                            f"--export_huggingface_dir=DIR")
    if run_dir is not None:
        return RunDirectory(run_dir).read_info().get("nsp_loss", True)
    return holds_next_sentence_head(checkpoint)
