"""run_pretraining.py as a function of its settings: what a notebook, a job or a test calls.

    from bert_packed.training.pretraining import PretrainingSettings, run_pretraining

    settings = PretrainingSettings.of(bert_config_file="bert_config.json", output_dir="runs/tiny",
                                      input_files="runs/data/packed/packed-*.tfrecord",
                                      num_train_steps=20, learning_rate=1e-3)
    result = run_pretraining(settings)
    print("\\n".join(result.summary))

The command (bert_packed/cli/run_pretraining.py) parses its flags into the same settings and
prints what this returns.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from bert_packed.console.root_logger import root_logger_kept
from bert_packed.inputs.file_identity import one_reading_per_file
from bert_packed.storage.run_directory import EVAL_LOG, RunDirectory
from bert_packed.training.assemble import PretrainingSettings, assemble
from bert_packed.training.launch import cluster_of_this_task, make_strategy
from bert_packed.training.step_pool import StepPool, pool_or_own

if TYPE_CHECKING:  # the loop and the compiled step import TensorFlow: imported when a run starts
    from bert_packed.training.loop import RunResult

__all__ = ["PretrainingResult", "PretrainingSettings", "run_pretraining"]


@dataclasses.dataclass(frozen=True)
class PretrainingResult:
    """What run_pretraining made.

    Attributes:
      directory: the run's directory (checkpoints, logs, mllog.txt, eval_results.txt).
      run: how training ended (loop.RunResult: the last step and train record, or the signal that
        stopped it after a save); None when it only evaluated (--do_train=false).
      evaluation: the last evaluation's record (step, mlm_accuracy, loss, ...; {} when none).
      summary: the lines that end a finished training run (sequences, time, throughput, the final
        evaluation, the outputs, the MLPerf log's check); [] otherwise.
    """

    directory: RunDirectory
    run: RunResult | None
    evaluation: dict
    summary: list[str]


@root_logger_kept()
def run_pretraining(settings: PretrainingSettings, step_pool: StepPool | None = None,
                    flags_text: str = "") -> PretrainingResult:
    """Pre-trains (or, with do_train false, evaluates) as `python run_pretraining.py` with these
    settings does: every setting and file checked before any device is touched, then the run
    resumed or started in output_dir.

    Args:
      settings: every setting by its flag's name (PretrainingSettings.of(...)).
      step_pool: compiled steps kept for reuse across runs (a StepPool; None: this call's own).
      flags_text: the command line as a flagfile, recorded in the run's flags.txt.

    Returns:
      What it made (PretrainingResult).

    Raises:
      UserError: a setting, a file or a record that cannot make the run, in one line.
    """
    from bert_packed.training.distribution import leave_together
    from bert_packed.training.loop import evaluate_only, train_and_evaluate
    from bert_packed.training.memory import check_replica_memory
    from bert_packed.training.process import run_set_up
    from bert_packed.training.report import run_summary

    step_pool = pool_or_own(step_pool)
    distribution = settings.distribution()
    cluster = cluster_of_this_task(distribution)  # first: under Slurm it picks this task's GPUs
    with one_reading_per_file():  # each file's size and first 64 KiB read once: one request on a bucket
        config, train_data, eval_data = assemble(settings, flags_text)  # every check before any device
    with run_set_up(config):
        strategy = make_strategy(distribution, cluster)
        if settings["do_train"]:  # before anything compiles
            check_replica_memory(config, train_data, strategy)
        with step_pool.holding(config, train_data, strategy) as step:
            if not settings["do_train"]:
                record = evaluate_only(config, eval_data, step)
                leave_together(step.strategy)
                return PretrainingResult(RunDirectory(config.run.output_dir), None, record, [])
            result = train_and_evaluate(config, train_data, eval_data, step)
            leave_together(step.strategy)  # the chief last: its process holds the workers' coordination service
    evaluation = (result.directory.read_log(EVAL_LOG)[-1:] or [{}])[0]
    if result.stopped_by:
        return PretrainingResult(result.directory, result, evaluation, [])
    bert = config.model.bert
    summary = run_summary(result.directory, config.eval.target_mlm_accuracy, config.run.submission_division,
                          bool(eval_data.files), (bert.hidden_size, bert.num_hidden_layers) == (1024, 24))
    return PretrainingResult(result.directory, result, evaluation, summary)
