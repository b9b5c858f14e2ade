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

from bert_packed.cli.common import run
from bert_packed.cli.settings_flags import define_flags, from_flags
from bert_packed.console.tensorflow_loading import import_tensorflow
from bert_packed.model.config import ExportSettings
from bert_packed.settings import help_groups

FLAGS = flags.FlagValues()
SETTINGS = (ExportSettings,)
define_flags(FLAGS, *SETTINGS, module_name=__name__)
HELP_GROUPS = help_groups(*SETTINGS)
flags.mark_flags_as_required(["checkpoint", "bert_config_file", "output_dir"], flag_values=FLAGS)

PROGRAM = "export_model"


def main(argv) -> None:
    del argv
    settings = from_flags(FLAGS, ExportSettings)
    import_tensorflow(FLAGS.verbosity, command=True)
    from bert_packed.training.export import export_model

    exported = export_model(settings)
    print(f"{PROGRAM}: {exported.source} (step {exported.step:,}) -> {exported.written} ({exported.format})")


def entry_point():
    run(main, PROGRAM, "output_dir", "Nothing exported is taken for complete", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
