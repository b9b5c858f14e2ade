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

Three corpora, each in runs/JOB (the configs/tiny_JOB_*.cfg flagfiles name these paths):
wikipedia_like, the shipped sample's text cut to Wikipedia's length mix, which packs at a factor
of about 2 as MLPerf's Wikipedia does; sample, the sample's long articles as they are, which
pack at 1.2 (the long-article case of docs/experiments.md); corpus, your own text (--corpus):
no phase 1, and phase 2 unpacked and packed from your weights (--init_checkpoint) or from
random ones.

    python scripts/main_job.py --corpus='my/text/*.txt.gz'     # make run CORPUS='my/text/*.txt.gz'
"""

from __future__ import annotations

import glob
import os
import re
import shlex

from _jobs import command, command_unless_done, flags_of, print_stage, read_text, seed_values
from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import SettingsError
from bert_packed.storage import files
from bert_packed.storage.files import write_text_atomically
from bert_packed.training.step_pool import StepPool

PROGRAM = "main_job"
# The phase-2 configurations compared; the first is the baseline. On your own text: packed
# against unpacked.
PHASE2 = ("unpacked", "packed_batch_corrected", "packed_adjusted_betas", "packed_plain_betas", "packed_online")
CORPUS_PHASE2 = ("unpacked", "packed_batch_corrected")
# In runs/corpus: what phase 2 starts from (--init_checkpoint, or random weights), and the text
# (--corpus and --data_flags) the records were made from.
PHASE2_START, TEXT = "phase2_start.txt", "text.txt"
# create_pretraining_data's flags that the job sets itself: the text, where its records go, and
# what phase 2 needs of them (L=512, P=76, held-out documents for its evaluations).
JOB_DATA_FLAGS = ("input_file", "output_dir", "output_file", "max_seq_length", "max_predictions_per_seq",
                  "eval_fraction")
# The model's flags, given by the job's own (checked before any stage), in no --data_flags or
# --phase2_flags on your text.
MODEL_FLAGS = {"vocab_file": "VOCAB_FILE", "bert_config_file": "BERT_CONFIG_FILE", "init_checkpoint": "INIT_CHECKPOINT"}

FLAGS = flags.FlagValues()
flags.DEFINE_enum("job", "wikipedia_like", ["wikipedia_like", "sample", "corpus"],
                  "The corpus (runs/JOB); corpus: your own text, --corpus.", flag_values=FLAGS)
flags.DEFINE_string("corpus", None, "Your own text (runs/corpus): a glob, or globs separated by commas, of files in any "
                                    "input format, gzip, bzip2 or xz too.", flag_values=FLAGS)
flags.DEFINE_string("vocab_file", None, "With --corpus: its vocabulary (BERT's uncased by default; python -m "
                                        "bert_packed.vocab builds one of your own).", flag_values=FLAGS)
flags.DEFINE_string("bert_config_file", None, "With --corpus: the model (configs/bert_config_tiny.json by default; "
                                              "its vocab_size holds the vocabulary's).", flag_values=FLAGS)
flags.DEFINE_string("init_checkpoint", None, "With --corpus: the weights phase 2 starts from (a run directory, a "
                                             "checkpoint, a Hugging Face directory); without it, random weights.",
                                             flag_values=FLAGS)
flags.DEFINE_string("data_flags", "", "With --corpus: flags added to create_pretraining_data's command, split as "
                                      "--phase1_flags (\"--input_format=jsonl --text_field=body --dupe_factor=5\").",
                                      flag_values=FLAGS)
flags.DEFINE_list("seeds", ["1"], "Phase 2's seeds (`make experiments`: 1,2,3).", flag_values=FLAGS)
flags.DEFINE_list("baseline_seeds", [], "More seeds of the unpacked baseline alone (`make experiments`: 4,5).", flag_values=FLAGS)
flags.DEFINE_string("curves", None, "The comparison's PNG (default runs/JOB/curves.png).", flag_values=FLAGS)
flags.DEFINE_string("phase1_flags", "", "Flags added to phase 1's command, split as a shell splits a line "
                                        "(--phase1_flags=\"--train_batch_size=2 --submission_org='My Org'\").", flag_values=FLAGS)
flags.DEFINE_string("phase2_flags", "", "Flags added to every phase-2 command, the phase-1 weights' evaluation "
                                        "at L=512 included, split as --phase1_flags.", flag_values=FLAGS)
flags.DEFINE_string("throughput_flags", "", "Flags added to the throughput measurement, split as --phase1_flags.",
                    flag_values=FLAGS)


def stage(number: int, what: str) -> None:
    print_stage(number, 9, what)


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
    return flags_of(module, name, shell_words(name))


def seeds() -> tuple[list[str], list[str]]:
    """--seeds and --baseline_seeds: integers, at least one of --seeds, none given twice (each
    seed's run has a directory of its own)."""
    given = {"seeds": seed_values("seeds", FLAGS.seeds), "baseline_seeds": seed_values("baseline_seeds",
                                                                                       FLAGS.baseline_seeds)}
    if not given["seeds"]:
        raise SettingsError("--seeds is empty: expected at least one seed (--seeds=1)")
    every = [int(value) for values in given.values() for value in values]
    twice = sorted({seed for seed in every if every.count(seed) > 1})
    if twice:
        raise SettingsError(f"--seeds={','.join(FLAGS.seeds)} --baseline_seeds={','.join(FLAGS.baseline_seeds)}: "
                            f"seed {twice[0]} is given twice: each seed's run has a directory of its own")
    return given["seeds"], given["baseline_seeds"]


def own_text() -> tuple[str, list[str], list[str]]:
    """The job, and with --corpus the flags of your own text: the model's, added to every
    phase-2 command (before --phase2_flags, which may change them), and the vocabulary's with
    --data_flags, added to create_pretraining_data's. They are for --corpus alone: the shipped
    jobs' flagfiles name their own model and vocabulary."""
    given = [name for name in ("vocab_file", "bert_config_file", "init_checkpoint") if getattr(FLAGS, name)]
    given += ["data_flags"] if FLAGS.data_flags.strip() else []
    if FLAGS.corpus is None:
        if FLAGS.job == "corpus":
            raise SettingsError("--job=corpus runs on your own text: give --corpus (a glob of your text files)")
        if given:
            raise SettingsError(f"--{given[0]} is for --corpus (your own text): the {FLAGS.job} job's flagfiles name "
                                f"its model and vocabulary")
        return FLAGS.job, [], []
    if not FLAGS.corpus.strip():
        raise SettingsError("--corpus is empty: expected a glob of your text files (--corpus='my/text/*.txt.gz')")
    if FLAGS["job"].present and FLAGS.job != "corpus":
        raise SettingsError(f"--job={FLAGS.job} and --corpus={FLAGS.corpus}: give one (--corpus runs in runs/corpus)")
    if FLAGS.phase1_flags.strip():
        raise SettingsError("--phase1_flags (PHASE1_FLAGS): your text has no phase 1; --phase2_flags (PHASE2_FLAGS) "
                            "go to its runs")
    data_flags = checked_flags("data_flags", "bert_packed.cli.create_pretraining_data")
    for word in data_flags:
        name = word.removeprefix("--").partition("=")[0]
        if name in JOB_DATA_FLAGS or name.startswith(("help", "flagfile")):
            raise SettingsError(f"--data_flags (DATA_FLAGS): {word}: the job sets it (your text's records at L=512 in "
                                f"runs/corpus/unpacked, a tenth of its documents held out for phase 2's evaluations)")
    for option in ("data_flags", "phase2_flags"):
        for word in shell_words(option):
            name = word.removeprefix("--").partition("=")[0]
            if name in MODEL_FLAGS:
                raise SettingsError(f"--{option} ({option.upper()}): {word}: give --{name} ({MODEL_FLAGS[name]}=), "
                                    f"which the job checks before any stage and gives every command that needs it")
    fits_the_model()
    same_text("runs/corpus", text_made_from())
    phase2_start("runs/corpus", starting_weights_and_model())  # refused now, not at stage 5
    model = [f"--{name}={getattr(FLAGS, name)}" for name in ("bert_config_file", "init_checkpoint", "vocab_file")
             if getattr(FLAGS, name)]
    vocabulary = [f"--vocab_file={FLAGS.vocab_file}"] if FLAGS.vocab_file else []
    return "corpus", model, vocabulary + data_flags


def text_made_from() -> str:
    """The record of what runs/corpus holds the job of: --corpus, --vocab_file and --data_flags."""
    return "\n".join([f"--corpus={FLAGS.corpus}", f"--vocab_file={FLAGS.vocab_file or ''}",
                      *shell_words("data_flags")]) + "\n"


def same_text(directory: str, record: str) -> None:
    """Refuses at once a directory that holds the job on other text (or another vocabulary, or
    other --data_flags): its records would be made again under finished runs."""
    path = f"{directory}/{TEXT}"
    if os.path.exists(path):
        before = read_text(path)
        if before != record:
            was = before.splitlines()[0].removeprefix("--corpus=")
            raise SettingsError(f"{directory} holds the job on --corpus={was} (CORPUS=) with its vocabulary and "
                                f"--data_flags ({path}); this command gives other ones: remove {directory} (or move "
                                f"it) to run on other text, or give the same")


def fits_the_model() -> None:
    """Refuses at once starting weights that are not there, and a vocabulary larger than the BERT
    config's vocab_size: found at stage 6 or 7, after the records are made."""
    from bert_packed.model import BertConfig
    from bert_packed.pretraining_data.tokenization import Tokenizer

    init = FLAGS.init_checkpoint
    if init and not any(files.exists(path) for path in (init, init + ".index", re.sub(r"\.index$", "", init))):
        raise SettingsError(f"--init_checkpoint={init} (INIT_CHECKPOINT=): not there; expected a run directory, a "
                            f"checkpoint (model.ckpt-N) or a Hugging Face directory")
    vocab_file = FLAGS.vocab_file or "data/bert_uncased_vocab.txt"
    config_file = FLAGS.bert_config_file or "configs/bert_config_tiny.json"
    tokens = Tokenizer(vocab_file).vocab_size  # refuses, in a line, what is no BERT vocabulary
    theirs = os.path.join(init or "", "vocab.txt")  # a Hugging Face directory's: the ids its weights were trained on
    if init and files.isfile(theirs):
        if read_text(theirs).split() != read_text(vocab_file).split():
                raise SettingsError(f"--init_checkpoint={init} (INIT_CHECKPOINT=) was trained on {theirs}, another "
                                    f"vocabulary than --vocab_file={vocab_file} (VOCAB_FILE=): each token id would "
                                    f"mean another word to its weights; give the vocabulary of those weights")
    vocab_size = BertConfig.from_json_file(config_file).vocab_size
    if vocab_size < tokens:
        raise SettingsError(f"--bert_config_file={config_file} (BERT_CONFIG_FILE=) has vocab_size={vocab_size:,}, but "
                            f"--vocab_file={vocab_file} holds {tokens:,} tokens: give the BERT config of that "
                            f"vocabulary (python -m bert_packed.vocab writes one with --bert_config_file)")


def data_stages(job: str, directory: str, data_flags: list[str]) -> None:
    """Stages 1 to 4: the corpus, its records at L=512, their plan and packs, and phase 1's records."""
    if job == "wikipedia_like":
        stage(1, f"the corpus: the sample's text cut to Wikipedia's length mix ({directory}/corpus)")
        command("make_wikipedia_like_corpus", f"--output_dir={directory}/corpus")
        # Two passes over the text, each masked anew (MLPerf's recipe makes ten): 6,300 sequences,
        # enough for the length histogram to be read to 0.13 in total variation.
        text, text_flags = f"{directory}/corpus/*.txt", ["--input_format=sentences", "--dupe_factor=2"]
    elif job == "sample":
        stage(1, "the corpus: the sample's 121 articles as they are (data/wikipedia_sample)")
        text, text_flags = "data/wikipedia_sample/wiki_*", ["--input_format=wikiextractor", "--dupe_factor=1"]
    else:  # its format detected, as create_pretraining_data says; one pass unless --data_flags says more
        stage(1, f"the corpus: your text, {FLAGS.corpus}")
        text, text_flags = FLAGS.corpus, ["--dupe_factor=1"]

    stage(2, f"pre-training records at L=512 ({directory}/unpacked)")
    command("bert_packed.cli.create_pretraining_data", f"--input_file={text}", *text_flags,
            f"--output_dir={directory}/unpacked", "--max_seq_length=512", "--max_predictions_per_seq=76",
            "--eval_fraction=0.1", *data_flags)
    if job == "corpus":  # made: what runs/corpus holds the job of
        write_text_atomically(f"{directory}/{TEXT}", text_made_from())

    stage(3, f"their lengths against Wikipedia's, and packing at L=512 ({directory}/packed)")
    command("bert_packed.cli.plan_packing", f"--histogram={directory}/unpacked/histogram.json", "--algorithm=lp",
            "--reference_histogram=data/histograms/wikipedia_512.json")
    command("bert_packed.cli.pack_pretraining_data", f"--input_files={directory}/unpacked/part-*.tfrecord",
            f"--output_dir={directory}/packed", "--max_seq_length=512", "--max_predictions_per_seq=76",
            "--max_sequences_per_pack=3", "--algorithm=lp", "--verify")

    if job == "corpus":
        stage(4, "no records at L=128: phase 1 (MLPerf's first, short phase, at L=128) is not run on your text")
        return
    stage(4, f"pre-training records at L=128 for phase 1 ({directory}/phase1_data)")
    command("bert_packed.cli.create_pretraining_data", f"--input_file={text}", text_flags[0],
            f"--output_dir={directory}/phase1_data", "--max_seq_length=128", "--max_predictions_per_seq=20",
            "--dupe_factor=1", "--eval_fraction=0.1")


def starting_weights(job: str, directory: str, phase1_flags: list[str], phase2_flags: list[str],
                     steps: StepPool) -> None:
    """Stages 5 and 6: phase 1, then its weights evaluated at L=512."""
    stage(5, f"phase 1 at L=128 ({directory}/phase1)")
    command("bert_packed.cli.run_pretraining", f"--flagfile=configs/tiny_{job}_phase1.cfg", *phase1_flags, steps=steps)
    stage(6, f"the phase-1 weights evaluated at L=512 ({directory}/phase1_eval)")
    command_unless_done(f"{directory}/phase1_eval/eval_results.txt", "bert_packed.cli.run_pretraining",
                        f"--flagfile=configs/tiny_{job}_phase2.cfg", "--do_train=false", "--do_eval",
                        f"--input_file={directory}/unpacked/eval-*.tfrecord", f"--output_dir={directory}/phase1_eval",
                        *phase2_flags, steps=steps)


def your_starting_weights(directory: str, phase2_flags: list[str], steps: StepPool) -> None:
    """Stages 5 and 6 on your text: no phase 1; the weights you gave evaluated at L=512 (or none:
    random weights), then recorded as what phase 2 starts from."""
    weights = starting_weights_and_model()
    start = (f"--init_checkpoint={FLAGS.init_checkpoint}" if FLAGS.init_checkpoint
             else "random weights (INIT_CHECKPOINT= gives weights of your own)")
    stage(5, f"no phase 1: phase 2 starts from {start}")
    before = phase2_start(directory, weights)
    if not FLAGS.init_checkpoint:
        stage(6, "no weights to evaluate before phase 2: it starts from random weights")
    else:
        stage(6, f"the weights phase 2 starts from evaluated at L=512 ({directory}/init_eval)")
        evaluated = f"{directory}/init_eval/eval_results.txt"
        if before != weights and os.path.exists(evaluated):
            os.remove(evaluated)  # other weights' figures
        command_unless_done(evaluated, "bert_packed.cli.run_pretraining", "--flagfile=configs/tiny_corpus_phase2.cfg",
                            "--do_train=false", "--do_eval", f"--input_file={directory}/unpacked/eval-*.tfrecord",
                            f"--output_dir={directory}/init_eval", *phase2_flags, steps=steps)
    write_text_atomically(f"{directory}/{PHASE2_START}", weights + "\n")


def measured_with(throughput_flags: list[str]) -> str:
    """What a throughput measurement depends on besides the records: the BERT config's content and
    the measurement's flags."""
    return f"{read_text(FLAGS.bert_config_file or 'configs/bert_config_tiny.json').strip()}\n{' '.join(throughput_flags)}\n"


def starting_weights_and_model() -> str:
    """What phase 2 on your text starts from, and the BERT config of its model."""
    return (f"{FLAGS.init_checkpoint or 'random weights'} with --bert_config_file="
            f"{FLAGS.bert_config_file or 'configs/bert_config_tiny.json'}")


def phase2_start(directory: str, weights: str) -> str | None:
    """What phase 2 on your text started from before (None: nothing recorded); other weights than
    those of a phase-2 run that started are refused: a run that started does not start again, and
    its curves would be compared as if from these."""
    record = f"{directory}/{PHASE2_START}"
    if not os.path.exists(record):
        return None
    before = read_text(record).strip()
    started = glob.glob(f"{glob.escape(directory)}/*_seed*/run.json")
    if before != weights and started:
        raise SettingsError(f"{directory}: phase 2 ran from {before}, and this command starts it from {weights}: "
                            f"give the weights it ran from, or remove {directory}/*_seed* to run it again")
    return before


def phase2(job: str, directory: str, seeds: list[str], baseline_seeds: list[str], phase2_flags: list[str],
           steps: StepPool) -> None:
    """Stage 7: each configuration of the job for each seed, then the baseline's other seeds."""
    configs = CORPUS_PHASE2 if job == "corpus" else PHASE2
    also = f"; unpacked also {' '.join(baseline_seeds)}" if baseline_seeds else ""
    stage(7, f"phase 2 at L=512: {' '.join(configs)}; seeds {' '.join(seeds)}{also}")
    runs = [(config, seed) for seed in seeds for config in configs] + [("unpacked", seed) for seed in baseline_seeds]
    for config, seed in runs:
        print(f"-- {config}, seed {seed}", flush=True)
        command("bert_packed.cli.run_pretraining", f"--flagfile=configs/tiny_{job}_{config}.cfg", f"--seed={seed}",
                f"--output_dir={directory}/{config}_seed{seed}", *phase2_flags, steps=steps)


def main(argv, steps: StepPool | None = None):
    del argv
    steps = steps or StepPool()  # the job's runs of one graph shape compile once
    (phase2_seeds, baseline_seeds), (job, model_flags, data_flags) = seeds(), own_text()
    directory = f"runs/{job}"
    curves = FLAGS.curves or f"{directory}/curves.png"
    phase1_flags = checked_flags("phase1_flags", "bert_packed.cli.run_pretraining")
    phase2_flags = model_flags + checked_flags("phase2_flags", "bert_packed.cli.run_pretraining")
    throughput_flags = checked_flags("throughput_flags", "benchmark_training")
    model = [f"--bert_config_file={FLAGS.bert_config_file}"] if FLAGS.bert_config_file else []

    data_stages(job, directory, data_flags)
    if job == "corpus":
        your_starting_weights(directory, phase2_flags, steps)
    else:
        starting_weights(job, directory, phase1_flags, phase2_flags, steps)
    phase2(job, directory, phase2_seeds, baseline_seeds, phase2_flags, steps)

    stage(8, f"throughput, packed and unpacked alternated on these records ({directory}/throughput.json)")
    command_unless_done(f"{directory}/throughput.json", "benchmark_training", "--configs=tiny", *model,
                        f"--sample_dir={directory}", "--modes=padded,packed", "--target=0",
                        f"--output_json={directory}/throughput.json", *throughput_flags,
                        made_from=(f"{directory}/unpacked/metadata.json", f"{directory}/packed/metadata.json"),
                        made_with=measured_with(throughput_flags))

    stage(9, f"comparison ({curves})")
    configs = CORPUS_PHASE2 if job == "corpus" else PHASE2
    compared = ([f"{directory}/unpacked_seed{seed}" for seed in baseline_seeds]
                + [f"{directory}/{config}_seed{seed}" for config in configs for seed in phase2_seeds])
    command("bert_packed.cli.compare_curves", f"--output={curves}", "--accuracy=auto",
            f"--throughput={directory}/throughput.json", *compared)
    weights = "phase1/model.ckpt-250, " if job != "corpus" else "init_eval/, " if FLAGS.init_checkpoint else ""
    print(f"results: {directory}/ (curves, */train_log.jsonl, */eval_log.jsonl, {weights}throughput.json)")


def entry_point(steps: StepPool | None = None):
    """The job; `steps`: a StepPool its caller keeps (the tests'), else the job's own."""
    run(lambda argv: main(argv, steps), PROGRAM, (), "Every finished stage is kept", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
