"""Comparing training runs: accuracy and loss curves, time to accuracy, realized speed-up.

A run is an output_dir of run_pretraining.py: train_log.jsonl, eval_log.jsonl and run.json.
"""

from __future__ import annotations

import dataclasses
import json
import os

from bert_packed.errors import UserError
from bert_packed.files import atomic_path


class RunError(UserError, ValueError):
    """A run directory lacks the logs a comparison needs."""


@dataclasses.dataclass
class Run:
    """One run's logs.

    Attributes:
      name: label in plots and tables.
      train: train_log.jsonl records.
      evals: eval_log.jsonl records (may be empty).
      info: run.json (input_mode, packing_factor, ...), {} if absent.
    """

    name: str
    train: list[dict]
    evals: list[dict]
    info: dict

    @property
    def train_seconds(self) -> float:
        """Seconds spent training, evaluations left out (older logs: all seconds)."""
        last = self.train[-1]
        return last.get("train_seconds", last["seconds"])

    @property
    def sequences_per_second(self) -> float:
        return self.train[-1]["sequences"] / self.train_seconds

    @property
    def real_tokens_per_second(self) -> float:
        return sum(r.get("real_tokens", 0.0) for r in self.train) / self.train_seconds

    def reach(self, accuracy: float) -> dict | None:
        """The first evaluation at or above `accuracy` (its step, sequences and seconds)."""
        return next((r for r in self.evals if r.get("mlm_accuracy", 0.0) >= accuracy), None)


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_run(directory: str, name: str | None = None) -> Run:
    """Reads a run directory.

    Raises:
      RunError: the directory or its train_log.jsonl is missing or empty.
    """
    if not os.path.isdir(directory):
        raise RunError(f"{directory}: no such run directory")
    try:
        train = _read_jsonl(os.path.join(directory, "train_log.jsonl"))
        evals = _read_jsonl(os.path.join(directory, "eval_log.jsonl"))
    except json.JSONDecodeError as e:
        raise RunError(f"{directory}: a log line is not JSON ({e})") from None
    if not train:
        raise RunError(f"{directory}: no train_log.jsonl records (expected a run_pretraining.py output_dir)")
    info_path = os.path.join(directory, "run.json")
    info = json.load(open(info_path, encoding="utf-8")) if os.path.exists(info_path) else {}
    return Run(name or os.path.basename(os.path.normpath(directory)), train, evals, info)


def summary_table(runs: list[Run], accuracy: float) -> list[dict]:
    """One row a run; speed-ups are against the first run (the baseline).

    Columns: run, input mode, packing factor, final eval accuracy and loss, sequences and seconds
    (evaluations included, as MLPerf times) to reach `accuracy`, sequences/s and real tokens/s
    (training time only), throughput speed-up, time-to-accuracy speed-up, and the throughput
    speed-up divided by the ratio of packing factors.
    """
    baseline = runs[0]
    base_reached = baseline.reach(accuracy)
    rows = []
    for run in runs:
        reached = run.reach(accuracy)
        final = run.evals[-1] if run.evals else {}
        speedup = run.sequences_per_second / baseline.sequences_per_second
        factor = run.info.get("packing_factor", 1.0) / baseline.info.get("packing_factor", 1.0)
        rows.append({
            "run": run.name,
            "input_mode": run.info.get("input_mode", "?"),
            "packing_factor": run.info.get("packing_factor", 1.0),
            "final_mlm_accuracy": final.get("mlm_accuracy"),
            "final_loss": final.get("loss", run.train[-1]["loss"]),
            "sequences_to_accuracy": reached["sequences"] if reached else None,
            "seconds_to_accuracy": reached["seconds"] if reached else None,
            "sequences_per_second": run.sequences_per_second,
            "real_tokens_per_second": run.real_tokens_per_second,
            "throughput_speedup": speedup,
            "time_to_accuracy_speedup": (base_reached["seconds"] / reached["seconds"]
                                         if reached and base_reached else None),
            "speedup_over_packing_factor": speedup / factor,
        })
    return rows


def format_table(rows: list[dict], accuracy: float) -> str:
    """Markdown table of summary_table rows."""

    def number(value, spec):
        return "-" if value is None else format(value, spec)

    lines = [f"| run | input | packing factor | final MLM accuracy | final loss | sequences to {accuracy:.3f} | "
             f"seconds to {accuracy:.3f} | sequences/s | real tokens/s | throughput speed-up | "
             f"time-to-accuracy speed-up | speed-up / packing factor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['input_mode']} | {r['packing_factor']:.3f} | {number(r['final_mlm_accuracy'], '.4f')} | "
            f"{number(r['final_loss'], '.4f')} | {number(r['sequences_to_accuracy'], ',')} | "
            f"{number(r['seconds_to_accuracy'], '.1f')} | {r['sequences_per_second']:.1f} | "
            f"{r['real_tokens_per_second']:,.0f} | {r['throughput_speedup']:.2f} | "
            f"{number(r['time_to_accuracy_speedup'], '.2f')} | {r['speedup_over_packing_factor']:.2f} |")
    return "\n".join(lines)


def plot(runs: list[Run], path: str) -> None:
    """MLM accuracy and loss against sequences seen and against wall time, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    for run in runs:
        curve = run.evals if run.evals else run.train
        for column, x in enumerate(("sequences", "seconds")):
            axes[0][column].plot([r[x] for r in curve], [r["mlm_accuracy"] for r in curve], marker="o",
                                 markersize=3, label=run.name)
            axes[1][column].plot([r[x] for r in run.train], [r["loss"] for r in run.train], label=run.name,
                                 alpha=0.8)
    source = "eval" if all(run.evals for run in runs) else "train"
    for column, label in enumerate(("sequences seen", "wall time (s)")):
        axes[0][column].set(xlabel=label, ylabel=f"{source} MLM accuracy")
        axes[1][column].set(xlabel=label, ylabel="train loss")
    for axis in axes.ravel():
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("packed vs unpacked: accuracy and loss against sequences and time")
    figure.tight_layout()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=100, format=os.path.splitext(path)[1][1:] or "png")
    plt.close(figure)
