"""create_pretraining_data as a function of its settings: what the command, a notebook and a job
call. The settings are the MLPerf reference script's flags (CreateSettings; CorpusSettings, how a
corpus is read, is shared with the vocabulary builder); the work is create_dataset.py's.

    from bert_packed.pretraining_data.create_command import CreateSettings, create_pretraining_data

    metadata = create_pretraining_data(CreateSettings(input_file="data/wikipedia_sample/*",
                                                      output_dir="runs/data/unpacked", dupe_factor=2))
    metadata["num_sequences"], metadata["padding_fraction"]
"""

from __future__ import annotations

import dataclasses

from bert_packed.errors import SettingsError
from bert_packed.inputs.dataset_info import require_seq_length
from bert_packed.inputs.input_files import expand_globs
from bert_packed.pretraining_data.corpus import INPUT_FORMATS
from bert_packed.pretraining_data.create_dataset import (
    DatasetSettings,
    create_pretraining_dataset,
    create_pretraining_files,
)
from bert_packed.pretraining_data.instances import MaskingConfig
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE, vocabulary_path
from bert_packed.settings import check_settings, setting


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorpusSettings:
    """How a command reads a corpus (create_pretraining_data's, the vocabulary builder's)."""

    input_file: str | None = setting(None, "Comma-separated input files or globs, text in --input_format.",
                                     group="input")
    input_format: str = setting(
        "auto", "How the text files hold documents: " + "; ".join(f"{name}: {text}" for name, text in
                                                                  INPUT_FORMATS.items())
        + "; auto: detected from each input file's first lines, and said in one line.",
        group="input", choices=("auto", *INPUT_FORMATS))
    text_field: str = setting("text", "With --input_format=jsonl: the field of each object that holds its text.",
                              group="input")
    do_lower_case: bool = setting(True, "Lower-case and strip accents (uncased models).", group="input")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CreateSettings(CorpusSettings):
    """create_pretraining_data's settings (and `python -m bert_packed.beam create`'s), by their
    flags' names and with the MLPerf reference script's defaults where it has them, checked when
    built. dataset_settings() gives the job's own."""

    vocab_file: str = setting(DEFAULT_VOCAB_FILE, "BERT WordPiece vocabulary (the reference has no default).",
                              group="input")
    output_dir: str | None = setting(None, "Where the TFRecord shards, histogram.json and metadata.json go.",
                                     group="output")
    output_file: str | None = setting(None, "Instead of --output_dir, as the reference: one TFRecord file (or a "
                                            "comma-separated list, instances dealt round-robin), no metadata.json.",
                                      group="output")
    max_seq_length: int = setting(512, "L: tokens per instance, [CLS] and [SEP]s included.", group="instances",
                                  reference_default=128)
    max_predictions_per_seq: int = setting(76, "P: masked-LM predictions per instance at most.", group="instances",
                                           reference_default=20)
    do_whole_word_mask: bool = setting(False, "Mask whole words instead of WordPieces.", group="instances")
    random_seed: int = setting(12345, "Seed; with the same inputs the output is identical.", group="instances")
    dupe_factor: int = setting(10, "Passes over the data, each with different masks.", group="instances")
    masked_lm_prob: float = setting(0.15, "Share of tokens to predict.", group="instances")
    short_seq_prob: float = setting(0.1, "Probability of a shorter random target length per document.",
                                    group="instances")
    empty_documents: str = setting("warn", "What an empty document in the input does.", group="input",
                                   choices=("warn", "error"))
    eval_fraction: float = setting(0.0, "Share of each file's documents held out as eval-*.tfrecord.", group="output")
    num_workers: int = setting(0, "Worker processes (0: one per core).", group="run")

    def __post_init__(self):
        check_settings(self)
        require_seq_length(self.max_seq_length)
        if self.max_predictions_per_seq > self.max_seq_length:
            raise SettingsError(f"--max_predictions_per_seq={self.max_predictions_per_seq}: more than the "
                                f"--max_seq_length={self.max_seq_length} tokens of an instance")
        for name in ("max_predictions_per_seq", "dupe_factor"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name}={getattr(self, name)}: must be at least 1")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise SettingsError(f"--masked_lm_prob={self.masked_lm_prob}: must be in (0, 1)")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise SettingsError(f"--short_seq_prob={self.short_seq_prob}: must be in [0, 1]")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise SettingsError(f"--eval_fraction={self.eval_fraction}: must be in [0, 1)")
        if bool(self.output_dir) == bool(self.output_file):
            raise SettingsError("give one of --output_dir (a dataset directory) and --output_file (TFRecord files)")
        if self.output_file and self.eval_fraction:
            raise SettingsError("--eval_fraction needs --output_dir: --output_file holds training instances only")
        for name in ("random_seed", "num_workers"):
            if getattr(self, name) < 0:
                raise SettingsError(f"--{name}={getattr(self, name)}: must be >= 0")

    def dataset_settings(self) -> DatasetSettings:
        """What decides the output (the vocabulary found where --vocab_file names it)."""
        return DatasetSettings(
            vocab_file=vocabulary_path(self.vocab_file), do_lower_case=self.do_lower_case,
            config=MaskingConfig(self.max_seq_length, self.max_predictions_per_seq, self.masked_lm_prob,
                                 self.short_seq_prob, self.do_whole_word_mask),
            dupe_factor=self.dupe_factor, seed=self.random_seed, empty_documents=self.empty_documents,
            eval_fraction=self.eval_fraction, input_format=self.input_format, text_field=self.text_field)


def create_pretraining_data(settings: CreateSettings) -> dict:
    """Text -> unpacked MLPerf records, as `python scripts/create_pretraining_data.py` with these
    settings: into --output_dir (shards, histogram.json, metadata.json; resumed where a run
    stopped) or, as the reference, into the --output_file records.

    Returns:
      The dataset's metadata (metadata.json's content: counts, histogram statistics, settings).

    Raises:
      UserError: a setting, an input file or its text that cannot make records, in one line.
    """
    dataset = settings.dataset_settings()
    inputs = expand_globs(settings.input_file, "--input_file")
    if settings.output_file:
        outputs = [path.strip() for path in settings.output_file.split(",") if path.strip()]
        return create_pretraining_files(inputs, outputs, dataset, settings.num_workers)
    return create_pretraining_dataset(inputs, settings.output_dir, dataset, settings.num_workers)
