"""Fine-tuning on the shipped sample (`make finetune`), packed against padded, in one process.

    python scripts/finetune_job.py          # what `make finetune` runs, after `make run`

Two tasks made of the sample's text, whose labels the text determines
(scripts/_finetuning_tasks.py): pronouns, sentences classified by whether they refer to someone
by a pronoun (run_classifier, L=128: short texts, packing factor about 4), and first_year, a
passage's first year found as a span (run_squad, L=256, about 2). Each is fine-tuned packed and
padded from the main job's weights (its packed phase-2 run's, runs/wikipedia_like), with dev
evaluations along the way, for each seed; then the throughput is measured alternately in one
process (scripts/benchmark_finetuning.py) and the dev curves are drawn side by side, the seeds as
a band (compare_curves). Each stage says what it does in a line starting with "== "; running the
job again reuses every finished stage. Results in runs/finetune.
"""

from __future__ import annotations

import os

from _finetuning_tasks import write_tasks
from _jobs import command, command_unless_done, flags_of, print_stage, read_text, seed_values
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import SettingsError
from bert_packed.storage import files
from bert_packed.storage.files import write_text_atomically
from bert_packed.training.step_pool import StepPool

PROGRAM = "finetune_job"
DIRECTORY = "runs/finetune"
# make run's packed phase-2 run: its last exported weights start every fine-tuning run.
WEIGHTS_RUN = "runs/wikipedia_like/packed_batch_corrected_seed1"
MODES = ("padded", "packed")
# What the job's runs in DIRECTORY were made with (another value is another job: refused).
JOB_RECORD = "job.txt"

FLAGS = flags.FlagValues()
flags.DEFINE_string("init_checkpoint", None, f"The weights fine-tuning starts from (default: {WEIGHTS_RUN}'s last, "
                                             f"which `make run` writes).", flag_values=FLAGS)
flags.DEFINE_integer("sentences", 6000, "pronouns: training sentences (a tenth as many dev ones).", lower_bound=20,
                     flag_values=FLAGS)
flags.DEFINE_integer("passages", 2000, "first_year: training passages (a tenth as many dev ones).", lower_bound=20,
                     flag_values=FLAGS)
flags.DEFINE_float("num_train_epochs", 3.0, "Epochs of each task (google-research's default).", flag_values=FLAGS)
flags.DEFINE_integer("evaluations", 8, "Dev evaluations along each run (its curve's points).", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_float("learning_rate", 1e-4, "AdamW's peak learning rate for the tiny model (at 1e-3 two of four pronoun "
                                         "runs stayed at chance, at 3e-4 one of 14: docs/finetuning.md).", flag_values=FLAGS)
flags.DEFINE_list("seeds", ["1", "2"], "Seeds of each configuration (the curves' band: one seed's gap is noise).",
                  flag_values=FLAGS)
flags.DEFINE_list("throughput_flags", [], "Flags added to scripts/benchmark_finetuning.py (--rounds=2,--updates=4).",
                  flag_values=FLAGS)


def starting_weights() -> str:
    """--init_checkpoint, or the main job's packed phase-2 run's last exported weights."""
    init = FLAGS.init_checkpoint
    if init:
        if not any(files.exists(path) for path in (init, f"{init}.index")):
            raise SettingsError(f"--init_checkpoint={init}: not there; expected a checkpoint (model.ckpt-N) or a "
                                f"Hugging Face directory")
        return init
    exported = sorted(files.glob(f"{WEIGHTS_RUN}/model.ckpt-*.index"), key=lambda path: int(path.split("-")[-1][:-6]))
    if not exported:
        raise SettingsError(f"{WEIGHTS_RUN}: no weights; `make run` makes them (or give --init_checkpoint)")
    return exported[-1][:-len(".index")]


def checked_seeds() -> list[str]:
    seeds = seed_values("seeds", FLAGS.seeds)
    if not seeds:
        raise SettingsError("--seeds is empty: expected at least one seed (--seeds=1)")
    if len(set(seeds)) < len(seeds):
        raise SettingsError(f"--seeds={','.join(FLAGS.seeds)}: a seed given twice; each seed's run has a directory "
                            f"of its own")
    return seeds


def same_job(weights: str) -> None:
    """Refuses other weights or other task sizes, epochs or evaluations than the runs in
    DIRECTORY were made with (their directories would say "finished", with the others' curves);
    records them for the first run."""
    record = os.path.join(DIRECTORY, JOB_RECORD)
    job = (f"--init_checkpoint={weights} --sentences={FLAGS.sentences} --passages={FLAGS.passages} "
           f"--num_train_epochs={FLAGS.num_train_epochs} --evaluations={FLAGS.evaluations} "
           f"--learning_rate={FLAGS.learning_rate}\n")
    if os.path.exists(record) and read_text(record) != job and files.glob(f"{DIRECTORY}/*_seed*/run.json"):
        raise SettingsError(f"{DIRECTORY} holds the job run with {read_text(record).strip()}; this command gives "
                            f"{job.strip()}: remove {DIRECTORY} (or move it) to run it again, or give the same")
    files.makedirs(DIRECTORY)
    write_text_atomically(record, job)


def fine_tune(task: str, module: str, weights: str, seeds: list[str], examples: int, task_flags: list[str],
              steps: StepPool) -> None:
    """`task` fine-tuned packed and padded from `weights`, each seed (`examples` training examples a run)."""
    every = max(1, int(examples * FLAGS.num_train_epochs / FLAGS.evaluations))
    loop = max(1, min(10, every // 64))  # updates a compiled loop: evaluations fall between loops (32 examples an update)
    for seed in seeds:
        for mode in MODES:
            print(f"-- {task}, {mode}, seed {seed}", flush=True)
            command(module, *task_flags, f"--init_checkpoint={weights}",
                    "--bert_config_file=configs/bert_config_tiny.json", "--do_train", f"--input_mode={mode}",
                    f"--num_train_epochs={FLAGS.num_train_epochs}", f"--learning_rate={FLAGS.learning_rate}", f"--seed={seed}",
                    f"--eval_every_samples={every}", f"--iterations_per_loop={loop}",
                    f"--output_dir={DIRECTORY}/{task}_{mode}_seed{seed}", steps=steps)


def main(argv, steps: StepPool | None = None):
    del argv
    steps = steps or StepPool()  # the job's runs of one graph shape compile once
    weights, seeds = starting_weights(), checked_seeds()
    if FLAGS.num_train_epochs <= 0:
        raise SettingsError(f"--num_train_epochs={FLAGS.num_train_epochs}: must be above 0")
    measured = flags_of("benchmark_finetuning", "throughput_flags", FLAGS.throughput_flags)
    same_job(weights)
    tasks = f"{DIRECTORY}/tasks"
    print_stage(1, 4, f"two tasks made of the sample's text ({tasks})")
    written = write_tasks(tasks, FLAGS.sentences, FLAGS.passages)
    (pronouns, sentences), (first_year, passages) = written["pronouns"], written["first_year"]
    print(f"pronouns: {sentences:,} sentences, half of them referring to someone by a pronoun; first_year: "
          f"{passages:,} passages, answered by the first year they name -> {pronouns}, {first_year}")

    print_stage(2, 4, f"pronouns (run_classifier at L=128), padded and packed, from {weights}")
    fine_tune("pronouns", "bert_packed.cli.run_classifier", weights, seeds, sentences,
              ["--task_name=jsonl", f"--data_dir={pronouns}", "--do_eval", "--max_seq_length=128"], steps)

    print_stage(3, 4, f"first_year (run_squad at L=256), padded and packed, from {weights}")
    fine_tune("first_year", "bert_packed.cli.run_squad", weights, seeds, passages,
              [f"--train_file={first_year}/train.json", "--do_predict",
               f"--predict_file={first_year}/dev.json", "--max_seq_length=256", "--doc_stride=128",
               "--max_sequences_per_pack=4"], steps)

    print_stage(4, 4, f"throughput, packed and padded alternated, and the dev curves ({DIRECTORY})")
    measured = [f"--sentences={FLAGS.sentences}", f"--passages={FLAGS.passages}", *measured]
    command_unless_done(f"{DIRECTORY}/throughput.json", "benchmark_finetuning", "--target=0",
                        f"--output_json={DIRECTORY}/throughput.json", *measured, made_with=" ".join(measured) + "\n",
                        steps=steps)
    for task in ("pronouns", "first_year"):
        command("bert_packed.cli.compare_curves", f"--output={DIRECTORY}/{task}.png", "--accuracy=auto",
                *(f"{DIRECTORY}/{task}_{mode}_seed{seed}" for mode in MODES for seed in seeds))
    print(f"results: {DIRECTORY}/ (pronouns.png, first_year.png, */eval_log.jsonl, first_year_*/predictions.json, "
          f"throughput.json)")


def entry_point(steps: StepPool | None = None):
    """The job; `steps`: a StepPool its caller keeps (the tests'), else the job's own."""
    run(lambda argv: main(argv, steps), PROGRAM, (), "Every finished stage is kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
