r"""Export pre-trained weights where users fine-tune: a Hugging Face directory, or a TF1 checkpoint.

    python scripts/export_model.py --checkpoint=runs/wikipedia_like/packed_batch_corrected_seed1 \
        --bert_config_file=configs/bert_config_tiny.json --output_dir=runs/wikipedia_like/hf_model

--checkpoint takes a run directory (its newest weights: the model.ckpt-N a finished run exported,
or its newest training checkpoint), a TF1 checkpoint prefix (model.ckpt-N), or a Hugging Face
directory. --format=huggingface (the default) writes config.json, model.safetensors and the
tokenizer files, which transformers' BertForPreTraining.from_pretrained and keras-hub's
from_preset read; --format=tf1 writes model.ckpt-N with google-research names, bert_config.json
and vocab.txt. docs/model.md, "After pre-training", says how to fine-tune from either.
"""

from __future__ import annotations

from absl import flags

from bert_packed import files
from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags
from bert_packed.errors import SettingsError
from bert_packed.model.config import ExportSettings
from bert_packed.pretraining_data.tokenization import vocabulary_path
from bert_packed.run_directory import RunDirectory, program_of
from bert_packed.settings import help_groups
from bert_packed.tensorflow_loading import import_tensorflow

FLAGS = flags.FLAGS
SETTINGS = (ExportSettings,)
define_flags(*SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)
flags.mark_flags_as_required(["checkpoint", "bert_config_file", "output_dir"])

PROGRAM = "export_model"


def main(argv) -> None:
    del argv
    from bert_packed.model import BertConfig
    from bert_packed.pretraining_data.tokenization import Tokenizer

    bert = BertConfig.from_json_file(FLAGS.bert_config_file)
    vocab_file = vocabulary_path(FLAGS.vocab_file)
    Tokenizer(vocab_file, FLAGS.do_lower_case)  # a missing or foreign vocabulary: before any work
    import_tensorflow(FLAGS.verbosity)
    from bert_packed.model import BertPretrainingModel, export_huggingface
    from bert_packed.model.checkpoint import checkpoint_step, export_google_directory
    from bert_packed.model.huggingface import holds_classifier, holds_next_sentence_head, holds_span_head, load_weights
    from bert_packed.training.checkpoints import load_run_weights, run_and_step

    if files.absolute(FLAGS.output_dir.rstrip("/")) == files.absolute(FLAGS.checkpoint.rstrip("/")):
        raise SettingsError(f"--output_dir={FLAGS.output_dir}: the --checkpoint itself; export to another directory")
    run_dir, step = run_and_step(FLAGS.checkpoint)
    fine_tuned = program_of(RunDirectory(run_dir).read_info()) if run_dir is not None else "run_pretraining"
    if fine_tuned != "run_pretraining":  # its head is the task's: this command writes pre-training's
        raise SettingsError(f"--checkpoint={FLAGS.checkpoint}: a {fine_tuned} run; it exports with its own head: "
                            f"run the same {fine_tuned} command with --export_huggingface_dir=DIR (a finished run "
                            f"exports at once, nothing trained again)")
    if run_dir is None and (holds_classifier(FLAGS.checkpoint, unreadable=False)  # unreadable: loading says why
                            or holds_span_head(FLAGS.checkpoint, unreadable=False)):
        raise SettingsError(f"--checkpoint={FLAGS.checkpoint}: fine-tuned weights (a task's head); this command writes "
                            f"pre-training's heads: a fine-tuning run exports with its own, its command with "
                            f"--export_huggingface_dir=DIR")
    # A run trained with --nsp_loss=false (run.json says), or weights without the head, export without it.
    next_sentence = (RunDirectory(run_dir).read_info().get("nsp_loss", True) if run_dir is not None
                     else holds_next_sentence_head(FLAGS.checkpoint))
    model = BertPretrainingModel(bert, next_sentence)
    model.build()
    if run_dir is not None:
        source, step = load_run_weights(model, run_dir, step)
    else:
        load_weights(model, FLAGS.checkpoint)
        source, step = FLAGS.checkpoint, checkpoint_step(FLAGS.checkpoint)
    if FLAGS.format == "huggingface":
        written = export_huggingface(model, FLAGS.output_dir, vocab_file, FLAGS.do_lower_case)
    else:
        written = export_google_directory(model, FLAGS.output_dir, vocab_file, step)
    print(f"{PROGRAM}: {source} (step {step:,}) -> {written} ({FLAGS.format})")


def entry_point():
    run(main, PROGRAM, "output_dir", "Nothing exported is taken for complete")


if __name__ == "__main__":
    entry_point()
