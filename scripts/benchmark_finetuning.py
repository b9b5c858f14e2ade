"""Benchmark fine-tuning throughput, packed against padded, alternated: the sample's tasks or your own.

    python scripts/benchmark_finetuning.py
    python scripts/benchmark_finetuning.py --task_name=mrpc --data_dir=glue_data/MRPC    # a task of yours
    python scripts/benchmark_finetuning.py --train_file=train-v1.1.json --max_seq_length=384   # SQuAD

Your own task is any that run_classifier.py (--task_name, --data_dir: a GLUE task or jsonl) or
run_squad.py (--train_file) takes, read as the command reads it, with its --vocab_file.

Two tasks whose labels the text determines (scripts/_finetuning_tasks.py): pronouns, a sentence
classified by whether it refers to someone by a pronoun (run_classifier, L=128, short texts),
and first_year, a passage's first year found as a span (run_squad, L=256, 4 windows a row at
most). For each, one process builds a fine-tuning step per input mode, each update --batch_size
examples (packed: the packs that hold as many), and times --updates updates of each in turn,
--rounds times, alternating the order (bert_packed.training.throughput). The speed-up is packed
over padded examples/s; its ratio to the packing factor says how much of packing's promise is
kept (below --target: a line saying which task and why, exit status 1).
"""

from __future__ import annotations

import json
import os
import tempfile

from bert_packed.console.tensorflow_loading import import_tensorflow

import_tensorflow(verbosity=0, command=True)  # first: TensorFlow's start-up notices stay out of the tables

from _finetuning_tasks import write_tasks
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import SettingsError
from bert_packed.pretraining_data.tokenization import DEFAULT_VOCAB_FILE
from bert_packed.reports.speedups import (
    TOKENS_PROMISE,
    TOKENS_PROMISE_WHY,
    describe_speedup,
    median_and_range,
    summary,
    token_speedup,
)
from bert_packed.storage.files import write_text_atomically
from bert_packed.training.finetune import classifier_run, squad_run
from bert_packed.training.finetune_settings import ClassifierSettings, SquadSettings
from bert_packed.training.process import set_up_process
from bert_packed.training.throughput import Measured, measure_alternately

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TASKS = ("pronouns", "first_year")

FLAGS = flags.FlagValues()
flags.DEFINE_string("bert_config_file", os.path.join(ROOT, "configs", "bert_config_tiny.json"), "The model measured.",
                    flag_values=FLAGS)
flags.DEFINE_list("tasks", list(TASKS), f"Tasks to measure ({', '.join(TASKS)}).", flag_values=FLAGS)
flags.DEFINE_integer("sentences", 6000, "pronouns: training sentences.", lower_bound=20, flag_values=FLAGS)
flags.DEFINE_integer("passages", 2000, "first_year: training passages.", lower_bound=20, flag_values=FLAGS)
flags.DEFINE_integer("batch_size", 32, "Examples an update in every mode (google-research's default).", lower_bound=1,
                     flag_values=FLAGS)
flags.DEFINE_integer("rounds", 6, "Measured rounds (after one warm-up round).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("updates", 8, "Updates of each mode in a round.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_boolean("xla", False, "Both modes with --xla (the passes and each weight's optimizer step XLA-compiled).",
                     flag_values=FLAGS)
flags.DEFINE_string("output_json", None, "Also write the measurements here.", flag_values=FLAGS)
flags.DEFINE_string("task_name", None, "Your own classification task instead of the sample's: run_classifier's "
                                       "--task_name (a GLUE task, or jsonl), with --data_dir.", flag_values=FLAGS)
flags.DEFINE_string("data_dir", None, "With --task_name: the task's files, as run_classifier reads them.", flag_values=FLAGS)
flags.DEFINE_string("train_file", None, "Your own SQuAD v1.1 training file instead of the sample's tasks (run_squad's).",
                    flag_values=FLAGS)
flags.DEFINE_integer("max_seq_length", None, "L of your own task (default: run_classifier's 128, run_squad's 384).",
                     lower_bound=8, flag_values=FLAGS)
flags.DEFINE_string("vocab_file", DEFAULT_VOCAB_FILE, "Your own task's vocabulary (the model's).", flag_values=FLAGS)
flags.DEFINE_float("target", 0.9, "Exit status 1 when packed's speed-up is below this share of the packing factor "
                                  "(0: report only).", flag_values=FLAGS)

PROGRAM = "benchmark_finetuning"


def fine_tuning(task: str, directory: str | None, input_mode: str, work: str):
    """The run of `task` (the sample's, its files in `directory`; else --task_name's or
    --train_file's) in `input_mode`, as its command builds it."""
    common = dict(bert_config_file=FLAGS.bert_config_file, output_dir=os.path.join(work, f"{task}-{input_mode}"),
                  do_train=True, input_mode=input_mode, train_batch_size=FLAGS.batch_size, xla=FLAGS.xla)
    if task == "pronouns":
        return classifier_run(ClassifierSettings(task_name="jsonl", data_dir=directory, max_seq_length=128, **common))
    if task == "first_year":
        return squad_run(SquadSettings(train_file=os.path.join(directory, "train.json"), max_seq_length=256,
                                       doc_stride=128, max_sequences_per_pack=4, **common))
    own = dict(vocab_file=FLAGS.vocab_file, **common)
    if FLAGS.task_name:
        return classifier_run(ClassifierSettings(task_name=FLAGS.task_name, data_dir=FLAGS.data_dir,
                                                 max_seq_length=FLAGS.max_seq_length or 128, **own))
    return squad_run(SquadSettings(train_file=FLAGS.train_file, max_seq_length=FLAGS.max_seq_length or 384, **own))


def tasks_measured(work: str) -> dict[str, str | None]:
    """{task: its files' directory} of the tasks to measure: your own one, else the sample's."""
    if FLAGS.task_name and FLAGS.train_file:
        raise SettingsError("--task_name and --train_file: give one task of your own (a classifier's, or SQuAD's)")
    if FLAGS.task_name or FLAGS.data_dir:
        if not (FLAGS.task_name and FLAGS.data_dir):
            raise SettingsError("--task_name and --data_dir go together: the task and its files, as run_classifier "
                                "takes them")
        return {FLAGS.task_name: None}
    if FLAGS.train_file:
        return {os.path.basename(FLAGS.train_file): None}
    unknown = [task for task in FLAGS.tasks if task not in TASKS]
    if unknown:
        raise SettingsError(f"--tasks: no task {unknown[0]!r} of the sample's ({', '.join(TASKS)}); a task of your "
                            f"own: --task_name and --data_dir, or --train_file")
    written = write_tasks(os.path.join(work, "tasks"), FLAGS.sentences, FLAGS.passages)
    return {task: written[task][0] for task in FLAGS.tasks}


def main(argv, steps=None) -> int:
    """Returns the exit status: 1 when the target is missed. `steps`: the caller's StepPool."""
    del argv
    rounds = f"{FLAGS.rounds} round{'s' if FLAGS.rounds != 1 else ''}"
    results, missed, notes = {}, [], []
    with tempfile.TemporaryDirectory() as work:
        directories = tasks_measured(work)
        print(f"\nfine-tuning {os.path.basename(FLAGS.bert_config_file)}: {rounds} of {FLAGS.updates} updates of "
              f"{FLAGS.batch_size} examples per mode, alternated\n")
        print("| task | input | examples/s | real tokens/s | padding efficiency | packing factor | speed-up in real "
              "tokens/s (median, range) | of the real-token ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for task in directories:
            runs = {mode: fine_tuning(task, directories[task], mode, work) for mode in ("padded", "packed")}
            trainers = {}
            for mode, run in runs.items():  # each step taken as its run takes it: the pool keeps it as built
                set_up_process(run.config)
                trainers[mode] = Measured(run.config, run.train_data, run.objective, steps)
            try:
                result = measure_alternately(trainers, FLAGS.rounds, FLAGS.updates)
            finally:
                for trainer in trainers.values():
                    trainer.release()
            factor = runs["packed"].train_data.packing_factor
            results[task] = {**result, "packing_factor": factor, "batch_size": FLAGS.batch_size}
            for mode in runs:
                figures = result["modes"][mode]
                speedups, promised = token_speedup(result, mode)  # the rounds read other examples: in real tokens
                ratio = summary(speedups)["median"] / promised if mode == "packed" else None
                if ratio is not None and ratio < FLAGS.target:
                    missed.append(f"{task} {ratio:.3f}")
                print(f"| {task} | {mode} | {summary(figures['sequences_per_second'])['median']:.1f} | "
                      f"{summary(figures['real_tokens_per_second'])['median']:,.0f} | "
                      f"{summary(figures['padding_efficiency'])['median']:.1%} | "
                      f"{factor if mode == 'packed' else 1.0:.2f} | {median_and_range(speedups)} | "
                      + ("" if ratio is None else f"{ratio:.2f}") + " |", flush=True)
            notes.append(f"{task}: packed against padded, real tokens/s: "
                         f"{describe_speedup(*token_speedup(result), TOKENS_PROMISE)} (examples/s "
                         f"{summary(result['speedups']['packed'])['median']:.2f}x at packing factor {factor:.3f})")
    print("\n" + "\n".join([TOKENS_PROMISE_WHY, *notes]))
    if FLAGS.output_json:
        write_text_atomically(FLAGS.output_json, json.dumps(results, indent=1) + "\n")
    if missed:
        print(f"below --target={FLAGS.target:g} of the real-token ratio: {', '.join(missed)}. An update's fixed cost "
              "(the optimizer's pass over every weight) is large beside few packed rows: more examples an update "
              "(--batch_size) and --xla share it out (docs/finetuning.md)")
    return 1 if missed else 0


def entry_point(steps=None):
    """The command; `steps`: a StepPool its caller keeps (bert_packed.training.step_pool): the
    fine-tuning job's, whose runs compiled the steps of these shapes."""
    run(lambda argv: main(argv, steps), PROGRAM, "output_json", "Nothing is kept (--output_json is written at the end)",
        flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
