"""What a run says when it ends: one summary of its result, and the compliance checker's verdict
on its mllog.txt, read from the run directory."""

from __future__ import annotations

import logging
import os
import tempfile

from bert_packed.storage import files
from bert_packed.storage.run_directory import EVAL_LOG, MLLOG, TRAIN_LOG, RunDirectory

# The MLPerf ruleset the logs follow (the newest with BERT) and the closed division's target.
RULESET = "5.0.0"


def compliance_verdict(path: str) -> tuple[bool, str]:
    """(whether the MLPerf compliance checker passes the log at `path`, the first reason it does not).
    A log on a remote filesystem (`gs://`) is checked through a local copy: the checker opens paths."""
    from mlperf_logging.compliance_checker import mlp_compliance

    checker = mlp_compliance.make_checker("training", RULESET, True, True)
    logging.disable(logging.CRITICAL)  # the checker logs every rule it applies
    try:
        with tempfile.TemporaryDirectory() as local:
            if "://" in path:
                with files.open_file(path, "rb") as source, files.open_file(os.path.join(local, MLLOG), "wb") as copy:
                    copy.write(source.read())
                path = os.path.join(local, MLLOG)
            passed = checker.check_file(path, f"training_{RULESET}/common.yaml")
    finally:
        logging.disable(logging.NOTSET)
    problems = [*checker.not_overwritable, *checker.overwritable.values(), *checker.warnings.values()]
    reason = next((line.strip() for problem in problems for line in str(problem).splitlines() if line.strip()), "")
    return passed, reason


def run_summary(directory: RunDirectory, target: float, division: str, evaluates: bool,
                bert_large: bool = False) -> list[str]:
    """The lines that end a training run: sequences and time, throughput, the final evaluation (or
    why there is none), where the outputs are, and the checker's verdict on mllog.txt.

    Args:
      bert_large: the model is BERT-Large-shaped, whose target MLPerf's 0.720 is; another model's
        is the recipe's (--target_mlm_accuracy), said so.
    """
    train, evals = directory.read_log(TRAIN_LOG), directory.read_log(EVAL_LOG)
    if not train:
        return [f"{directory.path}: no update was logged"]
    last = train[-1]
    seconds = last.get("train_seconds", last["seconds"])
    tokens = sum(record.get("real_tokens", 0.0) for record in train)
    lines = [f"trained to step {last['step']}: {last['sequences']:,} sequences in {last['seconds']:.1f} s "
             f"({last['sequences'] / max(seconds, 1e-9):,.1f} sequences/s and {tokens / max(seconds, 1e-9):,.0f} real "
             f"tokens/s while training; {len(train)} updates of {last['sequences'] / len(train):.1f} sequences on "
             f"average)"]
    reached = bool(evals) and evals[-1].get("mlm_accuracy", 0.0) >= target
    if evals and evals[-1]["step"] == last["step"]:
        final = evals[-1]
        lines.append(f"final evaluation at step {final['step']}: masked-LM accuracy {final.get('mlm_accuracy', 0):.4f} "
                     f"({'MLPerf' if bert_large else 'the recipe'}'s target {target:.3f} "
                     f"{'reached' if reached else 'not reached'}), loss "
                     f"{final.get('loss', 0):.4f} over "
                     f"{final.get('num_sequences', 0):,.0f} sequences")
    elif not evaluates:
        lines.append("no evaluation: the run has no eval files (--eval_files, or --do_eval with --input_file)")
    lines.append(f"outputs: {directory.path} ({TRAIN_LOG}, {EVAL_LOG}, {MLLOG}, "
                 f"{directory.exported_weights(last['step']).rsplit('/', 1)[-1]}, checkpoints/, tensorboard/)")
    lines.append(f"{MLLOG}: {verdict_line(directory.file(MLLOG), division, evaluates, reached)}")
    return lines


def verdict_line(path: str, division: str, evaluates: bool, reached: bool) -> str:
    """The compliance checker's verdict on a run's mllog.txt, in words a user can act on."""
    passed, reason = compliance_verdict(path)
    if passed:
        return f"passes the MLPerf compliance checker (training {RULESET}, {division} division)"
    if not evaluates:
        return ("does not pass the MLPerf compliance checker: it holds no evaluation (eval_accuracy), which every "
                "division requires; train with eval files")
    if division == "closed" and not reached:
        return (f"does not pass the MLPerf compliance checker: the closed division requires the final evaluation to "
                f"reach the target; a run that stops short passes as --submission_division=open ({reason})")
    return f"does not pass the MLPerf compliance checker: {reason}"
