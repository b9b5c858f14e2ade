"""What decides a packed dataset (PackSettings), pack_pretraining_data's settings by their flags'
names (PackCommandSettings: the command's, and `python -m bert_packed.beam pack`'s), and
plan_packing's (PlanSettings)."""

from __future__ import annotations

import dataclasses
import logging
import numbers

from bert_packed.errors import SettingsError
from bert_packed.features import Shapes
from bert_packed.inputs.dataset import Dataset
from bert_packed.inputs.dataset_info import require_seq_length
from bert_packed.packing.plan import ALGORITHMS, DEFAULT_ALGORITHM
from bert_packed.settings import check_settings, given_or_changed, require_given, setting


@dataclasses.dataclass(frozen=True)
class PackSettings:
    """Everything that decides the packed output.

    Attributes:
      shapes: L, P and S (max_sequences_per_pack) of the packed data.
      algorithm: packing algorithm (bert_packed.packing.ALGORITHMS).
      seed: decides which sequences share a pack and the order of the packs.
      num_shards: output files at least (more when a bucket would exceed bucket_bytes).
      bucket_bytes: largest bucket of rows held in memory in pass 3.
    """

    shapes: Shapes
    algorithm: str = DEFAULT_ALGORITHM
    seed: int = 12345
    num_shards: int = 1
    bucket_bytes: int = 256 << 20

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackCommandSettings:
    """pack_pretraining_data's settings, by their flags' names, checked when built.

    Attributes (besides the settings):
      given: the names of the settings given on the command line (from Python, a value other
        than its default counts as given too): L and P not given are the inputs' (their
        metadata.json), else the defaults.
    """

    input_files: str | None = setting(None, "Comma-separated globs of unpacked TFRecord files.", group="input")
    output_dir: str | None = setting(None, "Where the packed shards, histogram.json and metadata.json go.",
                                     group="output")
    max_seq_length: int = setting(512, "L of the input records and of the packs (default: as the inputs' "
                                       "metadata.json records, else 512).", group="packs")
    max_predictions_per_seq: int = setting(76, "P of the input records; packs hold P + S (default: as metadata.json "
                                               "records, else 76).", group="packs")
    max_sequences_per_pack: int = setting(3, "S: at most this many sequences share a pack.", group="packs")
    algorithm: str = setting(DEFAULT_ALGORITHM, "Packing algorithm (see python -m bert_packed.packing).", group="packs",
                             choices=tuple(ALGORITHMS))
    seed: int = setting(PackSettings.seed, "Decides which sequences share a pack and the order of the packs.",
                        group="packs")
    num_shards: int = setting(PackSettings.num_shards, "Output files at least (more when the data is large).",
                              group="output")
    bucket_mb: int = setting(PackSettings.bucket_bytes >> 20, "Memory for one bucket of sequences in the writing "
                                                              "pass.", group="run")
    num_workers: int = setting(0, "Threads for every pass and for --verify (0: one per core).", group="run")
    verify: bool = setting(False, "Re-read the output and decode every pack back into its sequences.", group="output")
    given: frozenset[str] = frozenset()

    def __post_init__(self):
        check_settings(self)
        require_given(self, "input_files", "output_dir")
        for name in ("max_sequences_per_pack", "max_predictions_per_seq", "num_shards", "bucket_mb"):
            if getattr(self, name) < 1:
                raise SettingsError(f"--{name}={getattr(self, name)}: must be >= 1")
        for name in ("seed", "num_workers"):
            if getattr(self, name) < 0:
                raise SettingsError(f"--{name}={getattr(self, name)}: must be >= 0")

    def pack_settings(self, inputs: Dataset) -> PackSettings:
        """What decides the output of packing `inputs` (described): L and P as given, else as the
        inputs' metadata.json records, else the defaults.

        Raises:
          SettingsError: L out of range, or L or P other than the inputs'.
        """
        defaults = (PackCommandSettings.max_seq_length, PackCommandSettings.max_predictions_per_seq)
        given = [getattr(self, name) if name in given_or_changed(self) else None
                 for name in ("max_seq_length", "max_predictions_per_seq")]
        max_seq_length, max_predictions_per_seq = inputs.lengths(*given, defaults=defaults)
        if inputs.shapes is None and None in given:  # the records' own L and P are not known: say whose these are
            logging.warning("--input_files: no metadata.json beside the files: packing at L=%d and P=%d (the "
                            "defaults where not given); give --max_seq_length and --max_predictions_per_seq of the "
                            "records if they were made otherwise", max_seq_length, max_predictions_per_seq)
        if max_predictions_per_seq < 1:
            raise SettingsError(f"--max_predictions_per_seq={max_predictions_per_seq}: must be >= 1")
        require_seq_length(max_seq_length)
        return PackSettings(shapes=Shapes(max_seq_length, max_predictions_per_seq, self.max_sequences_per_pack),
                            algorithm=self.algorithm, seed=self.seed, num_shards=self.num_shards,
                            bucket_bytes=self.bucket_mb << 20)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """plan_packing's settings, by their flags' names, checked when built."""

    histogram: str | None = setting(None, "Histogram JSON: {'max_sequence_length': L, 'histogram': [c_1..c_L]} or a "
                                          "list.", group="input")
    max_sequence_length: int | None = setting(None, "L; default: the histogram file's max_sequence_length (or its "
                                                    "length).", group="input", aliases=("max-sequence-length",))
    algorithm: str = setting(DEFAULT_ALGORITHM, "Packing algorithm, or 'all' to compare them side by side.",
                             group="plan", choices=(*ALGORITHMS, "all"))
    max_sequences_per_pack: str = setting("3", "Depth: at most this many sequences per pack, or 'unlimited'.",
                                          group="plan", aliases=("max-sequences-per-pack",))
    reference_histogram: str | None = setting(None, "Also compare the histogram's mix of lengths with this one's "
                                                    "(data/histograms/wikipedia_512.json, say): padding, share at L, "
                                                    "total-variation distance.", group="report")
    json: bool = setting(False, "Print one JSON object (with the strategies) instead of a table.", group="report")

    def __post_init__(self):
        if isinstance(self.max_sequences_per_pack, numbers.Integral) and not isinstance(self.max_sequences_per_pack, bool):
            object.__setattr__(self, "max_sequences_per_pack", str(int(self.max_sequences_per_pack)))  # as the flag gives it
        check_settings(self)
        _ = self.depth  # a depth neither a number >= 1 nor 'unlimited' is refused here

    @property
    def depth(self) -> int | None:
        """max_sequences_per_pack as a number; None for 'unlimited'.

        Raises:
          SettingsError: neither an integer >= 1 nor 'unlimited'.
        """
        text = str(self.max_sequences_per_pack).strip()
        if text.lower() in ("none", "unlimited"):
            return None
        if not text.lstrip("-").isdigit():
            raise SettingsError(f"--max_sequences_per_pack={text}: expected an integer >= 1 or 'unlimited'")
        if int(text) < 1:
            raise SettingsError(f"--max_sequences_per_pack={text}: must be >= 1 (or 'unlimited')")
        return int(text)
