"""The main job and every fenced bash and python block of the README and of the guides in docs/
run as written, and say what they do in a few lines a person reads.

`make run` (the main job) runs first, in a directory laid out as a clone (the repository's
Makefile, configs, data and scripts; .venv is this environment), made small by the Makefile's
own PHASE1_FLAGS, PHASE2_FLAGS and THROUGHPUT_FLAGS: smaller batches, two phase-2 updates, one
measured round. It runs in this process, as the command make gives (`make -n`), as the blocks'
Python commands run: the make-made line is what is checked of make, and the steps it compiles
serve the blocks that follow (which compile none of their own). Then the blocks run in page
order (the README first, then docs/ by name) on what it left, with only sizes changed
(SMALLER). The other set-up lines (`make test` is this suite, `make experiments` is `make run`
with more seeds) are not run here. Every output is checked: a bounded number of lines, no
traceback, no TensorFlow C++ log line, no raw record.
"""

import gzip
import io
import json
import math
import os
import re
import select
import shlex
import subprocess
import sys
import tempfile

import pytest
from conftest import REPO, STEPS, TINY, run_command, run_script

from bert_packed.console.tensorflow_loading import STARTUP_NOTICES
from bert_packed.inputs.dataset_info import read_dataset_info

README = os.path.join(REPO, "README.md")
PAGES = [README] + sorted(os.path.join(REPO, "docs", name) for name in os.listdir(os.path.join(REPO, "docs"))
                          if name.endswith(".md"))
# test_the_main_job_runs_on_your_own_compressed_text_with_a_vocabulary_built_from_it runs the CORPUS= ones.
SET_UP = {"make run", "make finetune", "make test", "make experiments", "make experiments JOB=sample", "make ablation",
          "make run CORPUS='my/text/*.txt.gz'", "make run CORPUS='my/text/*.txt.gz' VOCAB_FILE=runs/mine/vocab/vocab.txt "
                                                "BERT_CONFIG_FILE=runs/mine/vocab/bert_config.json"}
# README sizes -> test sizes.
SMALLER = [
    (re.compile(r"--dupe_factor=10\b"), "--dupe_factor=1"),
    (re.compile(r"(run_pretraining\.py --flagfile=\S+)"), r"\1 --num_train_steps=2 --max_eval_steps=1"),
]
# The main job, small: phase 1 keeps its 250 steps (phase 2 starts from model.ckpt-250); every
# evaluation is one batch (the whole held-out set at L=512 took 5 s a run).
MAIN_JOB = ["run", "PHASE1_FLAGS=--train_batch_size=2 --eval_batch_size=16 --max_eval_steps=1",
            "PHASE2_FLAGS=--num_train_steps=2 --max_eval_steps=1 --submission_org='My Org'",
            "THROUGHPUT_FLAGS=--rounds=1 --updates=1"]
# TensorFlow's C++ log lines (`I0000 00:00:1732.5   123 port.cc:153] oneDNN ...`), and its older form.
TENSORFLOW_LOG = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\]|tensorflow/core/|oneDNN custom operations"
                            r"|absl::InitializeLog", re.M)


# What oneDNN says once when a graph holds int64 arithmetic (keras-hub's tokenizer does), in a
# user's own Python; the commands never show it.
ONEDNN_INT64 = re.compile(r"^E\d{4} [\d:.]+ +\d+ util\.cc:\d+\] oneDNN supports DT_INT64 only on platforms with AVX-512")


def assert_reads_well(output: str, where: str, max_lines: int, tensorflow_notices: bool = False) -> None:
    """A few lines a person reads: no traceback, no TensorFlow C++ line (but for its start-up
    notices, and ONEDNN_INT64, where `tensorflow_notices`: a user's own Python that imports
    TensorFlow shows them, the commands do not), no raw record (a JSON object, or a line too long to read)."""
    lines = output.splitlines()
    assert len(lines) <= max_lines, f"{where}: {len(lines)} lines (at most {max_lines}):\n{output[-3000:]}"
    assert "Traceback" not in output, f"{where}:\n{output[-3000:]}"
    if tensorflow_notices:
        output = "\n".join(line for line in lines if not STARTUP_NOTICES.match(line) and not ONEDNN_INT64.match(line))
    leaked = TENSORFLOW_LOG.search(output)
    assert leaked is None, f"{where}: a TensorFlow C++ log line: {output[leaked.start():leaked.start() + 200]}"
    for line in lines:
        assert len(line) <= 400, f"{where}: a line of {len(line)} characters: {line[:200]}..."
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        assert not isinstance(record, dict), f"{where}: a raw record: {line[:200]}"


def fenced_blocks(page: str = README) -> list[tuple[int, str, str]]:
    """(line number, language, text) of every fenced block of a page."""
    blocks, language, start, lines = [], None, 0, []
    with open(page, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                if language is None:
                    language, start, lines = line[3:].strip(), number, []
                else:
                    blocks.append((start, language, "".join(lines)))
                    language = None
            elif language is not None:
                lines.append(line)
    return blocks


def without_set_up(script: str) -> str:
    kept = []
    for line in script.splitlines():
        command = line.split("#", 1)[0].strip()
        if command in SET_UP:
            continue
        assert not command.startswith("make "), f"README: `{command}` is neither run here nor a set-up command"
        kept.append(line)
    return "\n".join(kept) + "\n"


def smaller(script: str) -> str:
    for pattern, replacement in SMALLER:
        script = pattern.sub(replacement, script)
    return script


def environment() -> dict:
    """As after `source .venv/bin/activate`; nothing else set (TensorFlow's own logging included)."""
    variables = {name: value for name, value in os.environ.items() if not name.startswith("TF_")}
    return {**variables, "CUDA_VISIBLE_DEVICES": "", "VIRTUAL_ENV": sys.prefix,
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


def lay_out_as_a_clone(root):
    """`root` laid out as a clone: the repository's Makefile, configs, data and scripts; .venv is
    this environment."""
    for name in ("Makefile", "pyproject.toml", "configs", "data", "scripts", "run_pretraining.py"):
        os.symlink(os.path.join(REPO, name), root / name)
    os.symlink(sys.prefix, root / ".venv")


def run_make(target: str, *variables: str, root) -> subprocess.CompletedProcess:
    """`make target variables` in `root`: the one command make gives for it (`make -n`), a Python
    script of this project, run in this process (run_here) as make would run it in its own.
    `root`'s stamp stands for this environment, installed (newer than pyproject.toml)."""
    planned = subprocess.run(["make", "--no-print-directory", "-n", target, f"STAMP={root / 'installed'}", *variables],
                             cwd=root, capture_output=True, text=True, timeout=60, env=environment())
    assert planned.returncode == 0, planned.stderr[-3000:]
    commands = [line for line in planned.stdout.replace("\\\n", " ").splitlines() if line.startswith(sys.prefix)]
    assert len(commands) == 1, planned.stdout[-3000:]
    words = shlex.split(commands[0])
    assert words[0] == os.path.join(sys.prefix, "bin", "python") and in_process_module(["python", *words[1:]])
    return run_here(["python", *words[1:]], root)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """A directory laid out as a clone, after a small `make run`; (its path, the job's output)."""
    root = tmp_path_factory.mktemp("checkout")
    lay_out_as_a_clone(root)
    (root / "installed").touch()
    return root, run_make(*MAIN_JOB, root=root)


def test_the_pages_have_their_set_up_commands_and_no_placeholder():
    commands = {line.split("#")[0].strip() for page in PAGES for _, language, text in fenced_blocks(page)
                if language == "bash" for line in text.splitlines()}
    assert commands >= SET_UP
    readme = {line.split("#")[0].strip() for _, language, text in fenced_blocks() if language == "bash"
              for line in text.splitlines()}
    assert {"make run", "make test"} <= readme
    for page in PAGES:
        for start, language, text in fenced_blocks(page):
            where = f"{os.path.relpath(page, REPO)} line {start}"
            assert language in ("bash", "python", "text"), f"{where}: a block without a language"
            for placeholder in ("path/to", "<", "..."):
                assert language == "text" or placeholder not in text, f"{where}: placeholder {placeholder!r}"


def test_every_test_the_pages_name_is_there():
    """The guides cite the tests that hold each guarantee (docs/reliability.md): a test renamed or
    gone leaves a citation that proves nothing."""
    defined = {name for path in os.listdir(os.path.join(REPO, "tests")) if path.endswith(".py")
               for name in re.findall(r"^def (test_\w+)", open(os.path.join(REPO, "tests", path), encoding="utf-8").read(),
                                      re.M)}
    cited = {name for page in PAGES for name in re.findall(r"`(test_\w+)`", open(page, encoding="utf-8").read())}
    assert len(cited) > 10 and cited <= defined, sorted(cited - defined)


def test_the_readme_is_a_front_page():
    with open(README, encoding="utf-8") as f:
        assert len(f.read()) <= 12_000


@pytest.mark.slow
def test_the_main_job_runs_and_reads_well(main_job):
    root, result = main_job
    assert result.returncode == 0, f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
    output = result.stdout + result.stderr
    assert_reads_well(output, "make run", 125)
    stages = [line for line in result.stdout.splitlines() if line.startswith("== ")]
    assert [line.split(" ", 2)[1] for line in stages] == [f"{n}/9" for n in range(1, 10)]
    # The corpus's records have Wikipedia's mix of lengths (issue 33: packing factor 2.0 +- 0.1 at
    # depth 3, a total-variation distance below 0.15), and every sentence of the sample once.
    assert "120 articles cut into 1,375 documents" in output and "22,290 sentences, 647,635 tokens, each once" in output
    distance = re.search(r"^total-variation distance ([\d.]+) per length, ([\d.]+) in 16-token bins", output, re.M)
    assert float(distance.group(1)) < 0.15 and float(distance.group(2)) < 0.08, distance.group(0)
    factor = re.search(r"^pack_pretraining_data: 6,307 sequences in [\d,]+ packs \(packing factor ([\d.]+),", output, re.M)
    assert abs(float(factor.group(1)) - 2.0) <= 0.1, factor.group(0)
    summaries = [line for line in result.stdout.splitlines() if line.startswith("mllog.txt: ")]
    assert len(summaries) == 6  # phase 1 and the five phase-2 runs each end on their summary
    assert all(line.startswith("mllog.txt: passes the MLPerf compliance checker") for line in summaries)
    assert "(PASS)" not in output and "(FAIL)" not in output  # a report-only benchmark prints no verdict
    assert os.path.exists(root / "runs" / "wikipedia_like" / "curves.png")
    # A quoted value in PHASE2_FLAGS reaches the runs as the shell would pass it.
    with open(root / "runs" / "wikipedia_like" / "packed_online_seed1" / "mllog.txt", encoding="utf-8") as f:
        assert '"key": "submission_org", "value": "My Org"' in f.read()


@pytest.mark.slow
def test_every_readme_block_runs_as_written(main_job, monkeypatch):
    """Every block runs; a bash block's `python` commands of this project in this process (each
    as in its own: bert_packed.cli.in_process), its other lines by bash; the Python blocks one
    after another in one interpreter of their own (PythonBlocks). Those training commands
    take the steps the main job compiled (SMALLER keeps them at its shapes): one that compiles a
    step of its own fails here, as its build would cost every run of the suite. Right after the
    main job's test, before other jobs' steps push its own out of the tests' pool (its kept_bytes)."""
    from bert_packed.training import step as training_step

    root, _ = main_job
    built, build = [], training_step.CompiledStep.__init__

    def counted(self, *args, **kwargs):
        built.append(where)
        build(self, *args, **kwargs)

    monkeypatch.setattr(training_step.CompiledStep, "__init__", counted)
    ran = 0
    python = PythonBlocks(root)
    try:
        for page in PAGES:
            for start, language, text in fenced_blocks(page):
                if language == "bash":
                    steps = python_commands_and_the_rest(smaller(without_set_up(text)))
                elif language == "python":
                    steps = [[sys.executable, "-c", text]]  # as `python -c` runs it
                else:
                    continue
                where = f"{os.path.relpath(page, REPO)} line {start}"
                output = ""
                for step in steps:
                    if isinstance(step, str):
                        result = subprocess.run(["bash", "-euo", "pipefail", "-c", step], cwd=root, capture_output=True,
                                                text=True, timeout=600, env=environment())
                    elif step[0] == "python":
                        result = run_here(step, root)
                    elif step[:2] == [sys.executable, "-c"]:
                        result = python.run(step)
                    else:
                        result = subprocess.run(step, cwd=root, capture_output=True, text=True, timeout=600,
                                                env=environment())
                    output += result.stdout + result.stderr
                    assert result.returncode == 0, f"{where}:\n{text}\n{result.stdout[-2000:]}{result.stderr[-3000:]}"
                assert_reads_well(output, where, 30 * (text.count("\n") + 1), tensorflow_notices=language == "python")
                ran += 1
    finally:
        python.close()
    assert ran >= 8
    assert built == [], (f"blocks that compiled a step of their own, not one of the main job's (or one "
                         f"the tests' StepPool let go): {built}")


@pytest.mark.slow
def test_the_fine_tuning_job_runs_from_the_main_job_s_weights_and_reads_well(main_job):
    """`make finetune` after `make run`, small: both tasks packed and padded from the main job's
    packed phase-2 weights, their dev curves and the alternated throughput."""
    root, _ = main_job
    result = run_make("finetune", "FINETUNE_FLAGS=--sentences=100 --passages=64 --num_train_epochs=2 --evaluations=2 "
                      "--seeds=1 --throughput_flags=--rounds=1,--updates=1", root=root)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert_reads_well(output, "make finetune", 110)
    stages = [line for line in result.stdout.splitlines() if line.startswith("== ")]
    assert [line.split(" ", 2)[1] for line in stages] == ["1/4", "2/4", "3/4", "4/4"]
    assert "from runs/wikipedia_like/packed_batch_corrected_seed1/model.ckpt-2" in stages[1]
    finetune = root / "runs" / "finetune"
    for task, examples in (("pronouns", 100), ("first_year", 64)):
        for mode in ("padded", "packed"):
            evaluations = [json.loads(line) for line in open(finetune / f"{task}_{mode}_seed1" / "eval_log.jsonl")]
            assert len(evaluations) >= 2  # a curve
            assert {"accuracy" if task == "pronouns" else "f1"} <= set(evaluations[-1])
        assert (finetune / f"{task}.png").exists()
        rows = re.findall(rf"^{finetune.relative_to(root)}/tasks/{task}/train\.json(?:l)?: (\d+) \w+ in (\d+) rows",
                          output, re.M)
        assert rows and int(rows[-1][1]) < int(rows[-1][0]) >= examples  # packed: fewer rows than sequences
    measured = json.loads((finetune / "throughput.json").read_text())
    assert set(measured) == {"pronouns", "first_year"} and measured["pronouns"]["packing_factor"] > 3
    assert re.search(r"^pronouns: packed against padded, real tokens/s: speed-up [\d.]+x", output, re.M)
    assert json.loads((finetune / "first_year_packed_seed1" / "predictions.json").read_text())


@pytest.mark.slow
def test_the_main_job_runs_on_your_own_compressed_text_with_a_vocabulary_built_from_it(corpus, tmp_path):
    """`make run CORPUS=...`'s job on the test corpus gzip-compressed, with a vocabulary built
    from it and the BERT config of its size: no phase 1, phase 2 unpacked and packed from random
    weights (said), throughput and comparison, in runs/corpus."""
    lay_out_as_a_clone(tmp_path)
    (tmp_path / "text").mkdir()
    for path in corpus:
        with open(path, "rb") as f, gzip.open(tmp_path / "text" / (os.path.basename(path) + ".gz"), "wb") as out:
            out.write(f.read())
    template = tmp_path / "template.json"
    template.write_text(json.dumps({**TINY, "max_position_embeddings": 512}))
    built = run_command("build_vocabulary", "--input_file=text/*.gz", "--vocab_file=mine/vocab.txt", "--vocab_size=1000",
                        f"--bert_config_file={template}", cwd=str(tmp_path))
    assert built.returncode == 0, built.stderr
    result = run_script("main_job", "--corpus=text/*.gz", "--vocab_file=mine/vocab.txt",
                        "--bert_config_file=mine/bert_config.json",
                        "--phase2_flags=--num_train_steps=2 --max_eval_steps=1 --train_batch_size=4 --eval_batch_size=8",
                        "--throughput_flags=--rounds=1 --updates=1 --batch_size=2", cwd=str(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert_reads_well(output, "main_job --corpus", 90)
    stages = [line for line in result.stdout.splitlines() if line.startswith("== ")]
    assert stages[0] == "== 1/9 the corpus: your text, text/*.gz" and len(stages) == 9
    assert "== 5/9 no phase 1: phase 2 starts from random weights (INIT_CHECKPOINT= gives weights of your own)" in stages
    assert "detected in text/wiki_00.gz and its other file" in output  # gzip read as it is
    vocabulary = (tmp_path / "mine" / "vocab.txt").read_text().splitlines()
    for records in ("unpacked", "packed"):
        assert read_dataset_info(str(tmp_path / "runs" / "corpus" / records)).details["vocab_size"] == len(vocabulary)
    for run in ("unpacked_seed1", "packed_batch_corrected_seed1"):
        with open(tmp_path / "runs" / "corpus" / run / "train_log.jsonl", encoding="utf-8") as f:
            losses = [json.loads(line)["loss"] for line in f]
        assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses), run
        assert "--bert_config_file=mine/bert_config.json" in (tmp_path / "runs" / "corpus" / run / "flags.txt").read_text()
    assert output.count("initialised from random weights (--seed=1): no --init_checkpoint") == 2
    assert output.count("mllog.txt: passes the MLPerf compliance checker") == 2
    assert (tmp_path / "runs" / "corpus" / "curves.png").exists() and (tmp_path / "runs" / "corpus" / "throughput.json").exists()
    refused_at_once(tmp_path, len(vocabulary))


def refused_at_once(root, vocab_size: int) -> None:
    """After the job on your text in `root`: other starting weights than its runs', other text,
    weights of another vocabulary, a vocabulary the model cannot hold are each refused in a line,
    nothing run or changed."""
    own = ("--corpus=text/*.gz", "--vocab_file=mine/vocab.txt", "--bert_config_file=mine/bert_config.json")
    (root / "theirs").mkdir()  # a Hugging Face directory's vocabulary: BERT's
    os.symlink(os.path.join(REPO, "data", "bert_uncased_vocab.txt"), root / "theirs" / "vocab.txt")
    for args, message in (
            ((*own, "--init_checkpoint=runs/corpus/unpacked_seed1"),
             "runs/corpus: phase 2 ran from random weights with --bert_config_file=mine/bert_config.json, and this "
             "command starts it from runs/corpus/unpacked_seed1 with --bert_config_file=mine/bert_config.json: give the "
             "weights it ran from, or remove runs/corpus/*_seed* to run it again"),
            (("--corpus=text/wiki_00.gz", *own[1:]),
             "runs/corpus holds the job on --corpus=text/*.gz (CORPUS=) with its vocabulary and --data_flags "
             "(runs/corpus/text.txt); this command gives other ones: remove runs/corpus (or move it) to run on other "
             "text, or give the same"),
            ((*own, "--init_checkpoint=theirs"),
             "--init_checkpoint=theirs (INIT_CHECKPOINT=) was trained on theirs/vocab.txt, another vocabulary than "
             "--vocab_file=mine/vocab.txt (VOCAB_FILE=): each token id would mean another word to its weights; give "
             "the vocabulary of those weights"),
            (("--corpus=text/*.gz", "--bert_config_file=mine/bert_config.json"),
             f"--bert_config_file=mine/bert_config.json (BERT_CONFIG_FILE=) has vocab_size={vocab_size:,}, but "
             f"--vocab_file=data/bert_uncased_vocab.txt holds 30,522 tokens: give the BERT config of that vocabulary "
             f"(python -m bert_packed.vocab writes one with --bert_config_file)")):
        before = sorted(os.listdir(root / "runs" / "corpus"))
        again = run_script("main_job", *args, cwd=str(root))
        assert again.returncode == 2 and again.stdout == "", again.stdout[-2000:]
        assert again.stderr.strip().splitlines() == [f"main_job: error: {message}"], again.stderr[-2000:]
        assert sorted(os.listdir(root / "runs" / "corpus")) == before


@pytest.mark.parametrize("args, message", [
    (["--vocab_file=v.txt"], "--vocab_file is for --corpus (your own text): the wikipedia_like job's flagfiles name "
                             "its model and vocabulary"),
    (["--job=corpus"], "--job=corpus runs on your own text: give --corpus (a glob of your text files)"),
    (["--corpus= "], "--corpus is empty: expected a glob of your text files (--corpus='my/text/*.txt.gz')"),
    (["--corpus=text/*", "--job=sample"], "--job=sample and --corpus=text/*: give one (--corpus runs in runs/corpus)"),
    (["--corpus=text/*", "--data_flags=--dupe_factr=2"], "--data_flags: '--dupe_factr=2': create_pretraining_data has "
                                                          "no such flag (--data_flags holds flags, --name=value)"),
    (["--corpus=text/*", "--data_flags=--max_seq_length=128"],
     "--data_flags (DATA_FLAGS): --max_seq_length=128: the job sets it (your text's records at L=512 in "
     "runs/corpus/unpacked, a tenth of its documents held out for phase 2's evaluations)"),
    (["--corpus=text/*", "--phase2_flags=--init_checkpoint=x"],
     "--phase2_flags (PHASE2_FLAGS): --init_checkpoint=x: give --init_checkpoint (INIT_CHECKPOINT=), which the job "
     "checks before any stage and gives every command that needs it"),
    (["--corpus=text/*", "--data_flags=--vocab_file=v.txt"],
     "--data_flags (DATA_FLAGS): --vocab_file=v.txt: give --vocab_file (VOCAB_FILE=), which the job checks before any "
     "stage and gives every command that needs it"),
    (["--corpus=text/*", "--phase1_flags=--train_batch_size=2"],
     "--phase1_flags (PHASE1_FLAGS): your text has no phase 1; --phase2_flags (PHASE2_FLAGS) go to its runs"),
    (["--corpus=text/*", "--init_checkpoint=no/such"], "--init_checkpoint=no/such (INIT_CHECKPOINT=): not there; "
                                                       "expected a run directory, a checkpoint (model.ckpt-N) or a "
                                                       "Hugging Face directory"),
    (["--phase2_flags=--submission_org='My Org"], "--phase2_flags=--submission_org='My Org: No closing quotation "
                                                  "(the value is split as a shell splits a line)"),
    (["--seeds="], "--seeds is empty: expected at least one seed (--seeds=1)"),
    (["--phase2_flags=--num_train_step=2"], "--phase2_flags: '--num_train_step=2': run_pretraining has no such flag "
                                            "(--phase2_flags holds flags, --name=value)"),
    (["--phase1_flags=--verbosity=1 --logtostderr --x=1"], "--phase1_flags: '--x=1': run_pretraining has no such flag "
                                                           "(--phase1_flags holds flags, --name=value)"),  # absl's, taken
    (["--phase1_flags=--train_batch_size=two"], "--phase1_flags: --train_batch_size=two: flag --train_batch_size=two: "
                                                "invalid literal for int() with base 10: 'two'"),
    (["--throughput_flags=--rounds=1 --updates=x"], "--throughput_flags: --updates=x: flag --updates=x: invalid literal "
                                                    "for int() with base 10: 'x'"),
    (["--seeds=1,x"], "--seeds=1,x: 'x' is not a seed: expected integers from 0 to 2**32 - 1 separated by commas "
                      "(--seeds=1,2,3)"),
    (["--baseline_seeds=²"], "--baseline_seeds=²: '²' is not a seed: expected integers from 0 to 2**32 - 1 separated "
                             "by commas (--baseline_seeds=1,2,3)"),
    (["--seeds=4294967296"], "--seeds=4294967296: '4294967296' is not a seed: expected integers from 0 to 2**32 - 1 "
                             "separated by commas (--seeds=1,2,3)"),
    (["--seeds=1,2", "--baseline_seeds=2"], "--seeds=1,2 --baseline_seeds=2: seed 2 is given twice: each seed's run "
                                            "has a directory of its own"),
])
def test_the_main_job_refuses_bad_flags_in_a_line_before_any_stage(tmp_path, args, message):
    result = run_script("main_job", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [f"main_job: error: {message}"]
    assert os.listdir(tmp_path) == []


def python_commands_and_the_rest(script: str) -> list[str | list[str]]:
    """A bash block's lines, continuations joined: each a `python` command of this project as its
    arguments (run in this process), else the line (run by bash)."""
    lines, line = [], ""
    for part in script.splitlines():
        line += part[:-1] + " " if part.endswith("\\") else part
        if not part.endswith("\\"):
            lines.append(line)
            line = ""
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words and words[0] == "python" and not set(words) & {"|", "&&", "||", ";", ">", "<"} and in_process_module(words):
            commands.append(words)
        elif words:
            commands.append(line)
    return commands


def in_process_module(words: list[str]) -> str | None:
    """The module that runs `python ...` (`scripts/X.py`, `run_pretraining.py`, `-m bert_packed.X`)
    in this process: the command of bert_packed/cli its file launches, or the script's own module
    when it has an entry_point; None for any other."""
    if words[1] == "-m":
        if not words[2].startswith("bert_packed."):
            return None
        path = os.path.join(REPO, *words[2].split("."), "__main__.py")
    else:
        path = os.path.join(REPO, words[1])
    if not os.path.isfile(path):
        return None
    text = open(path, encoding="utf-8").read()
    launched = re.search(r"from bert_packed\.cli\.(\w+) import entry_point|run_module\(\"bert_packed\.cli\.(\w+)\"", text)
    if launched:
        return f"bert_packed.cli.{launched.group(1) or launched.group(2)}"
    if words[1].startswith("scripts/") and "\ndef entry_point(" in text:
        return os.path.basename(words[1])[:-len(".py")]
    return None


# The interpreter of the docs' Python blocks (PythonBlocks): for each line "<code file>\t<output
# file>" it runs the code as `python -c` would (its own globals, __name__ "__main__"), with its
# output, the C++ libraries' too, in the output file, and answers the exit status in a line.
BLOCKS_INTERPRETER = r"""
import os, sys, traceback
requests, replies = os.fdopen(os.dup(0)), os.fdopen(os.dup(1), "w")
for request in requests:
    code, output = request.rstrip("\n").split("\t")
    with open(output, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            exec(compile(open(code).read(), "<string>", "exec"), {"__name__": "__main__"})
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
    replies.write(f"{status}\n")
    replies.flush()
"""


class PythonBlocks:
    """The docs' Python blocks, each run as `python -c` runs it, one after another in one
    interpreter of their own: as a user's (the environment of `source .venv/bin/activate`, the
    clone's directory, sys.argv and sys.path as for `-c`), not the test's, and TensorFlow, PyTorch
    and keras-hub imported once for every block instead of once each (17 s less here)."""

    def __init__(self, root):
        self.process = subprocess.Popen([sys.executable, "-c", BLOCKS_INTERPRETER], cwd=root, env=environment(),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, words: list[str]) -> subprocess.CompletedProcess:
        """One block (`words[2]`), as subprocess.run would give it, its output all in stdout."""
        with tempfile.TemporaryDirectory() as directory:
            code, output = os.path.join(directory, "block.py"), os.path.join(directory, "output")
            with open(code, "w", encoding="utf-8") as f:
                f.write(words[2])
            self.process.stdin.write(f"{code}\t{output}\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], 600)
            status = self.process.stdout.readline().strip() if ready else ""
            written = open(output, encoding="utf-8").read() if os.path.exists(output) else ""
        if not status:
            self.process.kill()
            return subprocess.CompletedProcess(words, 1, written, "the blocks' interpreter ended or took over 600 s")
        return subprocess.CompletedProcess(words, int(status), written, "")

    def close(self) -> None:
        """Ends the interpreter (killed if it does not end within a minute)."""
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def run_here(words: list[str], cwd) -> subprocess.CompletedProcess:
    """`python ...` (in_process_module's) run in this process; its output, the C++ libraries'
    (TensorFlow's log lines) included, captured as a subprocess's would be."""
    from bert_packed.cli.in_process import run_in_process

    scripts = os.path.join(REPO, "scripts")
    if scripts not in sys.path:
        sys.path.append(scripts)
    sys.stdout.flush()
    sys.stderr.flush()
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_io, saved_fds = (sys.stdout, sys.stderr), (os.dup(1), os.dup(2))
    with tempfile.TemporaryFile("w+") as native:
        os.dup2(native.fileno(), 1)
        os.dup2(native.fileno(), 2)
        sys.stdout, sys.stderr = stdout, stderr
        try:
            program, args = (words[2], words[3:]) if words[1] == "-m" else (words[1], words[2:])
            status = run_in_process(in_process_module(words), args, program, str(cwd), STEPS)
        finally:
            sys.stdout, sys.stderr = saved_io
            for fd, saved in zip((1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
        native.seek(0)
        return subprocess.CompletedProcess(words, status, stdout.getvalue(), stderr.getvalue() + native.read())
