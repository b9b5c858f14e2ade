"""The main job (`make run`), its stages one after another in one process.

    python scripts/main_job.py --job=wikipedia_like        # what `make run` runs

As MLPerf's recipe runs: the corpus; pre-training records at L=512 and L=128 with the same
held-out documents; a short phase 1 at L=128 whose weights start every phase-2 run; packing at
L=512 (verified lossless); phase 2 at L=512 unpacked, packed batch-corrected, packed with
adjusted betas, packed with plain betas, and packed on the fly, for each seed, every run seeing
as many sequences; the packed/unpacked throughput measured alternately on these records; and the
comparison (curves PNG and table).

Each stage is the command a user would type (docs/ shows them), run in this process
(bert_packed.cli.in_process): TensorFlow is imported once, not a dozen times. Each stage says
what it does in a line starting with "== ", and each command in a line or a few. Running the job
again reuses every finished stage; the first stage that fails ends it with its exit status.

Two corpora, each in runs/JOB (the configs/tiny_JOB_*.cfg flagfiles name these paths):
wikipedia_like, the shipped sample's text cut to Wikipedia's length mix, which packs at a factor
of about 2 as MLPerf's Wikipedia does; sample, the sample's long articles as they are, which
pack at 1.2 (the long-article case of docs/experiments.md).
"""

from __future__ import annotations

import gc
import os
import re
import shlex
import sys

from absl import flags

from bert_packed.cli.common import run
from bert_packed.cli.in_process import command_in_this_process, run_in_process
from bert_packed.errors import SettingsError

PROGRAM = "main_job"
# The phase-2 configurations compared; the first is the baseline.
PHASE2 = ("unpacked", "packed_batch_corrected", "packed_adjusted_betas", "packed_plain_betas", "packed_online")

FLAGS = flags.FLAGS
flags.DEFINE_enum("job", "wikipedia_like", ["wikipedia_like", "sample"], "The corpus (runs/JOB).")
flags.DEFINE_list("seeds", ["1"], "Phase 2's seeds (`make experiments`: 1,2,3).")
flags.DEFINE_list("baseline_seeds", [], "More seeds of the unpacked baseline alone (`make experiments`: 4,5).")
flags.DEFINE_string("curves", None, "The comparison's PNG (default runs/JOB/curves.png).")
flags.DEFINE_string("phase1_flags", "", "Flags added to phase 1's command, split as a shell splits a line "
                                        "(--phase1_flags=\"--train_batch_size=2 --submission_org='My Org'\").")
flags.DEFINE_string("phase2_flags", "", "Flags added to every phase-2 command, the phase-1 weights' evaluation "
                                        "at L=512 included, split as --phase1_flags.")
flags.DEFINE_string("throughput_flags", "", "Flags added to the throughput measurement, split as --phase1_flags.")


def command(module: str, *args: str) -> None:
    """Runs a command in this process; a failure ends the job with the command's exit status."""
    sys.stdout.flush()
    status = run_in_process(module, list(args))
    if status:
        sys.exit(status)
    gc.collect()  # the command's models and datasets: a dozen commands then take the memory of one


def command_unless_done(done: str, module: str, *args: str) -> None:
    """command(), unless the file `done` is there: the commands whose output is a file, not a
    directory that says whether it is finished."""
    if os.path.exists(done):
        print(f"already done: {done}", flush=True)
    else:
        command(module, *args)


def stage(number: int, what: str) -> None:
    print(f"== {number}/9 {what}", flush=True)


def shell_words(name: str) -> list[str]:
    """The value of the flag `name` split as a shell splits a line; an unbalanced quote is refused."""
    value = getattr(FLAGS, name)
    try:
        return shlex.split(value)
    except ValueError as e:
        raise SettingsError(f"--{name}={value}: {e} (the value is split as a shell splits a line)") from None


def checked_flags(name: str, module: str) -> list[str]:
    """The words of the flag `name` (shell_words), each a flag that the command `module` takes with
    a value it takes: a typo is said before any stage, not when its stage comes minutes later."""
    words = shell_words(name)
    with command_in_this_process(module):
        for word in words:
            key, given, value = word.removeprefix("--").partition("=")
            flag = FLAGS[key] if key in FLAGS else None
            negated = key.startswith("no") and key[2:] in FLAGS and FLAGS[key[2:]].boolean
            if not word.startswith("--") or (flag is None and not negated):
                raise SettingsError(f"--{name}: {word!r}: {module.rsplit('.', 1)[-1]} has no such flag "
                                    f"(--{name} holds flags, --name=value)")
            try:
                if given and flag is not None:
                    flag.parse(value)
            except (flags.Error, ValueError) as e:
                raise SettingsError(f"--{name}: {word}: {e}") from None
    return words


def seeds() -> tuple[list[str], list[str]]:
    """--seeds and --baseline_seeds: integers, at least one of --seeds, none given twice (each
    seed's run has a directory of its own)."""
    given = {"seeds": FLAGS.seeds, "baseline_seeds": FLAGS.baseline_seeds}
    for name, values in given.items():
        for value in values:
            if not re.fullmatch(r"[0-9]+", value.strip()) or int(value) >= 2**32:
                raise SettingsError(f"--{name}={','.join(values)}: {value!r} is not a seed: expected integers from 0 "
                                    f"to 2**32 - 1 separated by commas (--{name}=1,2,3)")
    if not given["seeds"]:
        raise SettingsError("--seeds is empty: expected at least one seed (--seeds=1)")
    every = [int(value) for values in given.values() for value in values]
    twice = sorted({seed for seed in every if every.count(seed) > 1})
    if twice:
        raise SettingsError(f"--seeds={','.join(FLAGS.seeds)} --baseline_seeds={','.join(FLAGS.baseline_seeds)}: "
                            f"seed {twice[0]} is given twice: each seed's run has a directory of its own")
    return [str(int(v)) for v in given["seeds"]], [str(int(v)) for v in given["baseline_seeds"]]


def phase2(job: str, directory: str, seeds: list[str], baseline_seeds: list[str], phase2_flags: list[str]) -> None:
    """Stage 7: each configuration of PHASE2 for each seed, then the baseline's other seeds."""
    also = f"; unpacked also {' '.join(baseline_seeds)}" if baseline_seeds else ""
    stage(7, f"phase 2 at L=512: {' '.join(PHASE2)}; seeds {' '.join(seeds)}{also}")
    phase2 = [(config, seed) for seed in seeds for config in PHASE2] + [("unpacked", seed) for seed in baseline_seeds]
    for config, seed in phase2:
        print(f"-- {config}, seed {seed}", flush=True)
        command("bert_packed.cli.run_pretraining", f"--flagfile=configs/tiny_{job}_{config}.cfg", f"--seed={seed}",
                f"--output_dir={directory}/{config}_seed{seed}", *phase2_flags)


def main(argv):
    del argv
    job, (phase2_seeds, baseline_seeds) = FLAGS.job, seeds()
    directory = f"runs/{job}"
    curves = FLAGS.curves or f"{directory}/curves.png"
    phase1_flags = checked_flags("phase1_flags", "bert_packed.cli.run_pretraining")
    phase2_flags = checked_flags("phase2_flags", "bert_packed.cli.run_pretraining")
    throughput_flags = checked_flags("throughput_flags", "benchmark_training")
    if job == "wikipedia_like":
        stage(1, f"the corpus: the sample's text cut to Wikipedia's length mix ({directory}/corpus)")
        command("make_wikipedia_like_corpus", f"--output_dir={directory}/corpus")
        # Two passes over the text, each masked anew (MLPerf's recipe makes ten): 6,300 sequences,
        # enough for the length histogram to be read to 0.13 in total variation.
        text, input_format, dupe_factor = f"{directory}/corpus/*.txt", "sentences", 2
    else:
        stage(1, "the corpus: the sample's 121 articles as they are (data/wikipedia_sample)")
        text, input_format, dupe_factor = "data/wikipedia_sample/wiki_*", "wikiextractor", 1

    stage(2, f"pre-training records at L=512 ({directory}/unpacked)")
    command("bert_packed.cli.create_pretraining_data", f"--input_file={text}", f"--input_format={input_format}",
            f"--output_dir={directory}/unpacked", "--max_seq_length=512", "--max_predictions_per_seq=76",
            f"--dupe_factor={dupe_factor}", "--eval_fraction=0.1")

    stage(3, f"their lengths against Wikipedia's, and packing at L=512 ({directory}/packed)")
    command("bert_packed.cli.plan_packing", f"--histogram={directory}/unpacked/histogram.json", "--algorithm=lp",
            "--reference_histogram=data/histograms/wikipedia_512.json")
    command("bert_packed.cli.pack_pretraining_data", f"--input_files={directory}/unpacked/part-*.tfrecord",
            f"--output_dir={directory}/packed", "--max_seq_length=512", "--max_predictions_per_seq=76",
            "--max_sequences_per_pack=3", "--algorithm=lp", "--verify")

    stage(4, f"pre-training records at L=128 for phase 1 ({directory}/phase1_data)")
    command("bert_packed.cli.create_pretraining_data", f"--input_file={text}", f"--input_format={input_format}",
            f"--output_dir={directory}/phase1_data", "--max_seq_length=128", "--max_predictions_per_seq=20",
            "--dupe_factor=1", "--eval_fraction=0.1")

    stage(5, f"phase 1 at L=128 ({directory}/phase1)")
    command("bert_packed.cli.run_pretraining", f"--flagfile=configs/tiny_{job}_phase1.cfg", *phase1_flags)

    stage(6, f"the phase-1 weights evaluated at L=512 ({directory}/phase1_eval)")
    command_unless_done(f"{directory}/phase1_eval/eval_results.txt", "bert_packed.cli.run_pretraining",
                        f"--flagfile=configs/tiny_{job}_phase2.cfg", "--do_train=false", "--do_eval",
                        f"--input_file={directory}/unpacked/eval-*.tfrecord", f"--output_dir={directory}/phase1_eval",
                        *phase2_flags)

    phase2(job, directory, phase2_seeds, baseline_seeds, phase2_flags)

    stage(8, f"throughput, packed and unpacked alternated on these records ({directory}/throughput.json)")
    command_unless_done(f"{directory}/throughput.json", "benchmark_training", "--configs=tiny",
                        f"--sample_dir={directory}", "--modes=padded,packed", "--target=0",
                        f"--output_json={directory}/throughput.json", *throughput_flags)

    stage(9, f"comparison ({curves})")
    compared = ([f"{directory}/unpacked_seed{seed}" for seed in baseline_seeds]
                + [f"{directory}/{config}_seed{seed}" for config in PHASE2 for seed in phase2_seeds])
    command("bert_packed.cli.compare_curves", f"--output={curves}", "--accuracy=auto",
            f"--throughput={directory}/throughput.json", *compared)
    print(f"results: {directory}/ (curves, */train_log.jsonl, */eval_log.jsonl, phase1/model.ckpt-250, "
          "throughput.json)")


def entry_point():
    run(main, PROGRAM, (), "Every finished stage is kept")


if __name__ == "__main__":
    entry_point()
