"""The shipped sample's text cut to Wikipedia's length mix: the main job's corpus (`make run`, stage 1).

    python scripts/make_wikipedia_like_corpus.py --output_dir=runs/wikipedia_like/corpus

The sample holds 121 long articles (median about 3,000 words), so its pre-training records at
L=512 are mostly full and pack at a factor of 1.2; MLPerf's Wikipedia packs at 2.0, because most
of its articles are short. This cuts each article into documents of consecutive sentences whose
token counts are drawn from a log-normal (median --median_tokens, spread --sigma), so that
create_pretraining_data makes records whose lengths follow Wikipedia's histogram
(data/histograms/wikipedia_512.json; docs/data.md has the figures). It is the sample's text cut
to Wikipedia's length mix, not more Wikipedia: every sentence of the input is in exactly one
document, in its article's order, and no sentence is changed.

Output: one file per input file, `wikipedia_like-00000.txt` ..., one sentence a line and a blank
line between documents (create_pretraining_data's `--input_format=sentences`). Deterministic: the
same inputs, flags and seed write the same bytes; a file already there with those bytes is left
as it is, one with other bytes is refused.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import OutputDirectoryError, SettingsError
from bert_packed.inputs.input_files import expand_globs
from bert_packed.pretraining_data.corpus import INPUT_FORMATS
from bert_packed.pretraining_data.length_mix import corpus_text, write_once
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE, Tokenizer, vocabulary_path
from bert_packed.storage import files, locks

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

FLAGS = flags.FlagValues()
flags.DEFINE_string("input_file", os.path.join(ROOT, "data", "wikipedia_sample", "wiki_*"),
                    "Comma-separated input files or globs (read as create_pretraining_data reads them).", flag_values=FLAGS)
flags.DEFINE_enum("input_format", "auto", ["auto", *INPUT_FORMATS], "How the input files are read, as "
                  "create_pretraining_data --input_format reads them (auto: detected from the first file).", flag_values=FLAGS)
flags.DEFINE_string("text_field", "text", "With --input_format=jsonl: the field that holds a record's text.", flag_values=FLAGS)
flags.DEFINE_string("output_dir", None, "Where the corpus files are written.", flag_values=FLAGS)
flags.DEFINE_string("vocab_file", DEFAULT_VOCAB_FILE, "WordPiece vocabulary the lengths are counted in.", flag_values=FLAGS)
flags.DEFINE_float("median_tokens", 150.0, "Median of the documents' token counts.", lower_bound=1.0, flag_values=FLAGS)
flags.DEFINE_float("sigma", 1.7, "Spread of the log-normal: the standard deviation of log(token count).",
                   lower_bound=0.0, flag_values=FLAGS)
flags.DEFINE_integer("seed", 1, "Seed of the cuts; file i draws from (seed, i).", lower_bound=0, flag_values=FLAGS)
flags.mark_flags_as_required(["output_dir"], flag_values=FLAGS)

PROGRAM = "make_wikipedia_like_corpus"


OUTPUT_FILE = re.compile(r"^wikipedia_like-(\d{5})\.txt$")


def main(argv) -> None:
    del argv
    for name in ("median_tokens", "sigma"):
        if not math.isfinite(FLAGS[name].value) or FLAGS[name].value > 1e6:
            raise SettingsError(f"--{name}={FLAGS[name].value}: expected a finite number below 1e6")
    inputs = expand_globs(FLAGS.input_file, "--input_file")
    tokenizer = Tokenizer(vocabulary_path(FLAGS.vocab_file))
    # Every input is read and cut before anything is written: a bad one leaves the directory as it was.
    texts, totals = [], {"articles": 0, "documents": 0, "sentences": 0, "tokens": 0, "document_tokens": []}
    for index, path in enumerate(inputs):
        text, counts = corpus_text(path, tokenizer, FLAGS.median_tokens, FLAGS.sigma, [FLAGS.seed, index],
                                   FLAGS.input_format, FLAGS.text_field)
        texts.append(text)
        for key, value in counts.items():
            totals[key] += value
    files.makedirs(FLAGS.output_dir)
    with locks.exclusive(os.path.join(FLAGS.output_dir, ".lock"), PROGRAM):
        files.remove_leftovers(FLAGS.output_dir)
        others = sorted(name for name in files.listdir(FLAGS.output_dir)
                        if (match := OUTPUT_FILE.match(name)) and int(match.group(1)) >= len(inputs))
        if others:
            raise OutputDirectoryError(f"{FLAGS.output_dir}: holds another corpus ({others[0]}, of more input files "
                                       f"than {len(inputs)}): give another --output_dir, or remove it")
        written = sum(write_once(os.path.join(FLAGS.output_dir, f"wikipedia_like-{index:05d}.txt"), text)
                      for index, text in enumerate(texts))
    quartiles = np.percentile(totals["document_tokens"], [25, 50, 75]).round().astype(int)
    print(f"{FLAGS.output_dir}: {len(inputs)} files ({written} written, {len(inputs) - written} already there): "
          f"{totals['articles']:,} articles cut into {totals['documents']:,} documents of "
          f"{'/'.join(f'{q:,}' for q in quartiles)} tokens (quartiles); {totals['sentences']:,} sentences, "
          f"{totals['tokens']:,} tokens, each once")


def entry_point():
    run(main, PROGRAM, "output_dir", "Finished files are kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
