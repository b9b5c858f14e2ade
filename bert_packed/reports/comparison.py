"""compare_curves as a function of its settings: runs compared side by side, their curves drawn
(PNG) and tabled, with the notes that say what the figures mean and, quoted under them, the
speed-ups a throughput benchmark measured alternately.

    from bert_packed.reports.comparison import CompareSettings, compare_curves

    comparison = compare_curves(CompareSettings(runs=("runs/a_seed1", "runs/b_seed1"), output="ab.png"))
    print("\n".join(comparison.lines))
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os

from bert_packed.errors import SettingsError, raise_if_retryable
from bert_packed.reports.curves import (
    AT_CHANCE_ADVICE,
    METRICS,
    Run,
    above_the_packing_factor,
    advice,
    at_sequences_table,
    automatic_accuracy,
    counted,
    figures_source,
    first_and_final,
    format_table,
    group_runs,
    is_number,
    load_run,
    metric_of,
    runs_have,
    summary_table,
)
from bert_packed.reports.speedups import (
    ABOVE_THE_FACTOR,
    ABOVE_THE_FACTOR_WHY,
    TOKENS_PROMISE,
    baseline_of,
    describe_speedup,
    token_speedup,
)
from bert_packed.settings import check_settings, given_or_changed, setting
from bert_packed.storage import files, locks
from bert_packed.storage.files import atomic_open
from bert_packed.storage.run_directory import RunError


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompareSettings:
    """compare_curves's settings, by their flags' names (the runs are its positional arguments).

    Attributes (besides the settings):
      runs: the run directories compared (run_pretraining's, run_classifier's, run_squad's
        --output_dir), the first configuration the baseline.
      given: the names of the settings given (--accuracy given holds fine-tuning runs to it).
    """

    labels: tuple[str, ...] | None = setting(None, "Comma-separated names for the runs (default: their directory "
                                                   "names).", group="runs")
    output: str = setting("compare_curves.png", "Where the PNG goes.", group="output")
    throughput: str | None = setting(None, "JSON of scripts/benchmark_training.py --output_json (fine-tuning runs: "
                                           "benchmark_finetuning.py's): quote its alternated speed-up measurement "
                                           "under the table.", group="output")
    at_sequences: float | None = setting(None, "Also a table of each configuration's eval loss and accuracy at this "
                                               "many sequences (the seeds' mean and range), with what its updates "
                                               "hold.", group="output")
    accuracy: str = setting("0.720", "MLM accuracy (MLPerf's target by default; fine-tuning runs: their accuracy or "
                                     "F1, 'auto' unless given) for the sequences-and-time-to-accuracy columns; "
                                     "'auto': 90% of the "
                                     "way from the highest first evaluation to the lowest final one, which every run "
                                     "reaches and none at its first evaluation (none: no figure, said).",
                            group="output")
    runs: tuple[str, ...] = ()
    given: frozenset[str] = frozenset()

    def __post_init__(self):
        if isinstance(self.accuracy, numbers.Real) and not isinstance(self.accuracy, bool):
            object.__setattr__(self, "accuracy", str(self.accuracy))  # as the flag gives it
        if not isinstance(self.runs, (tuple, list)):  # a string alone: its characters would be taken as runs
            raise SettingsError(f"runs={self.runs!r}: expected a list of run directories")
        runs = tuple(os.fspath(run) if isinstance(run, os.PathLike) else run for run in self.runs)
        if not all(isinstance(run, str) for run in runs):  # a bytes path too: the storage takes strings
            raise SettingsError(f"runs={self.runs!r}: expected a list of run directories")
        object.__setattr__(self, "runs", runs)  # a Path as its string
        check_settings(self)
        if self.at_sequences is not None and not 0 < self.at_sequences < math.inf:
            raise SettingsError(f"--at_sequences={self.at_sequences}: expected a number of sequences above 0")
        if self.accuracy != "auto":
            try:
                target = float(self.accuracy)
            except ValueError:
                raise SettingsError(f"--accuracy {self.accuracy!r}: expected a number or 'auto'") from None
            if not 0 <= target < math.inf:
                raise SettingsError(f"--accuracy {self.accuracy!r}: expected a number at least 0, or 'auto'")
        if not self.runs:
            raise SettingsError("expected one or more run directories (run_pretraining.py --output_dir)")
        if self.labels and len(self.labels) != len(self.runs):
            raise SettingsError(f"--labels has {len(self.labels)} names for {len(self.runs)} runs")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What compare_curves made.

    Attributes:
      rows: the table's rows, one a configuration (summary_table's), the baseline first.
      accuracy: the target of the to-target columns (None: none, the notes say why).
      lines: what the command prints: the table, its notes, the throughput quoted, the table at
        --at_sequences, and where the curves are.
      output: the PNG written.
    """

    rows: list[dict]
    accuracy: float | None
    lines: list[str]
    output: str


def compare_curves(settings: CompareSettings) -> Comparison:
    """Draws and tables settings.runs (runs named alike but for a trailing seed are one
    configuration: their mean and range).

    Raises:
      UserError: a run that cannot be read, a setting that does not fit the runs, in one line.
    """
    labels = settings.labels or [None] * len(settings.runs)
    runs = [load_run(directory, label) for directory, label in zip(settings.runs, labels)]
    without = [run.name for run in runs if run.info.get("nsp_loss") is False]
    if without and len(without) < len(runs):
        logging.warning("%s trained without the NSP loss (--nsp_loss=false), the others with it: their losses differ "
                        "by the NSP term; compare MLM accuracy (the MLPerf metric)", ", ".join(without))
    metric = metric_of(runs)
    # MLPerf's 0.720 is a target of MLM accuracy only: fine-tuning runs take 'auto' unless given one.
    automatic = settings.accuracy == "auto" or (metric != "mlm_accuracy" and "accuracy" not in given_or_changed(settings))
    unevaluated = [run.name for run in runs if not run.evals]
    if settings.accuracy == "auto" and unevaluated:
        raise SettingsError(f"--accuracy auto: {runs_have(unevaluated)} no evaluations (eval_log.jsonl), whose curves "
                            f"it picks a target from; give --accuracy=NUMBER")
    if automatic:
        accuracy = None if unevaluated else automatic_accuracy(runs)  # none: the note says why
    else:
        accuracy = float(settings.accuracy)
    with locks.exclusive(f"{settings.output}.lock", "compare_curves"):
        files.remove_leftovers(os.path.dirname(settings.output) or ".", of=os.path.basename(settings.output))
        plot(runs, settings.output)
    rows = summary_table(runs, accuracy)
    lines = [format_table(rows, accuracy), "", target_note(runs, rows, accuracy, automatic), clock_note(metric),
             *verdict_notes(rows)]
    if settings.throughput:
        lines += throughput_lines(settings.throughput, metric)
    if settings.at_sequences:
        lines += ["", at_sequences_table(runs, settings.at_sequences)]
    return Comparison(rows, accuracy, [*lines, "", f"curves: {settings.output}"], settings.output)


def target_note(runs: list[Run], rows: list[dict], accuracy: float | None, automatic: bool) -> str:
    """What the to-target columns mean: the target used, and whether any run reached it; or why
    there is no automatic target."""
    if accuracy is None:
        unevaluated = [run.name for run in runs if not run.evals]
        if unevaluated:
            return (f"no time-to-accuracy figure: {runs_have(unevaluated)} no evaluations (eval_log.jsonl); give "
                    f"--accuracy, or evaluate during training")
        if all(len(run.evals) == 1 for run in runs):
            return ("no time-to-accuracy figure: each run was evaluated once, so there is no curve to time; evaluate "
                    "during training (--eval_every_samples), or give --accuracy")
        first, final = first_and_final(runs)
        return (f"no time-to-accuracy figure: no accuracy is above every run's first evaluation and below every "
                f"run's final one (the highest first {first:.4f}, the lowest final {final:.4f}: curves flat, or not "
                f"overlapping), so no target tells the runs apart (--accuracy=auto); train longer, or give "
                f"--accuracy")
    how = "--accuracy=auto: every run reaches it, none at its first evaluation" if automatic else "--accuracy"
    reached = [row["run"] for row in rows if row["sequences_to_accuracy"] is not None]
    figure = METRICS[metric_of(runs)]
    if not reached:
        return (f"target {figure} {accuracy:.3f} ({how}): no configuration reached it in every seed, so the "
                f"to-target columns are empty; --accuracy=auto picks a target every run reaches")
    note = (f"target {figure} {accuracy:.3f} ({how}); {len(reached)} of the {len(rows)} configurations reached it "
            f"in every seed")
    if all(run.evals and run.evals[0].get(run.metric, 0.0) >= accuracy for run in runs):
        note += (f"; every run met it at its first evaluation, so the to-target columns time that evaluation only "
                 f"(is it a target of the {figure}'s scale?); --accuracy=auto picks one between the first evaluations "
                 f"and the final ones")
    return note


def verdict_notes(rows: list[dict]) -> list[str]:
    """What the table cannot tell: a clock speed-up above the packing factor, seeds at chance
    (left out of the seed ranges), and a gap between configurations of one seed (seed noise)."""
    notes = []
    above = [row["run"] for row in rows[1:] if above_the_packing_factor(row, rows[0])]
    if above:
        notes.append(f"{', '.join(above)}: a speed-up by the runs' clocks {ABOVE_THE_FACTOR} (marked so), "
                     f"{ABOVE_THE_FACTOR_WHY}; the runs' clocks are single measurements (clock_note)")
    chance = [name for row in rows for name in row["at_chance"]]
    if chance:
        notes.append(f"{', '.join(chance)}: at chance for the second half of {'its' if len(chance) == 1 else 'their'} "
                     f"evaluations, learned nothing (marked at chance), and left out of the seed ranges; "
                     f"{AT_CHANCE_ADVICE}")
    single = [row["run"] for row in rows if row["seeds"] == 1]
    if single:
        who = ("every configuration has" if len(single) == len(rows)
               else runs_have(single))
        notes.append(f"{who} one seed: a gap between curves cannot be told from seed noise; {advice(rows[0]['metric'])[1]}")
    return notes


def clock_note(metric: str) -> str:
    """What the clock columns are worth, and where the throughput to trust is measured."""
    return (f"{counted(metric)}/s and the speed-up by the runs' clocks come from each run's own wall clock, at the mercy of "
            "what else the machine ran meanwhile; the throughput speed-up to trust is measured alternately in one "
            f"process ({advice(metric)[0]}, --throughput)")


def plot(runs: list[Run], path: str) -> None:
    """Eval accuracy (Run.metric) and loss against sequences seen and against wall time, one PNG: one line
    a configuration (the seeds' mean), with the seeds' min-max as a band when there are several.
    When a run has no evaluations, every run is drawn from its training log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    source = figures_source(runs)
    for group in group_runs(runs):
        label = group.name if len(group.runs) == 1 else f"{group.name} ({len(group.runs)} seeds)"
        points = group.points(source)
        for column in (0, 1):
            x = [point[column] for point in points]
            for row, index in ((0, 2), (1, 3)):
                values = [point[index] for point in points]
                line, = axes[row][column].plot(x, [sum(v) / len(v) for v in values], marker="o", markersize=3,
                                               label=label)
                if len(group.runs) > 1:
                    axes[row][column].fill_between(x, [min(v) for v in values], [max(v) for v in values],
                                                   color=line.get_color(), alpha=0.2, linewidth=0)
    heads = {run.info.get("nsp_loss", True) for run in runs}
    loss = "MLM + NSP" if heads == {True} else "MLM" if heads == {False} else "MLM, + NSP where trained with it"
    if metric_of(runs) != "mlm_accuracy":
        loss = "the task's"
    for column, label in enumerate((f"{counted(metric_of(runs))} seen", "wall time (s)")):
        axes[0][column].set(xlabel=label, ylabel=f"{source} {METRICS[metric_of(runs)]}")
        axes[1][column].set(xlabel=label, ylabel=f"{source} loss ({loss})")
    for axis in axes.ravel():
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    other = "unpacked" if metric_of(runs) == "mlm_accuracy" else "padded"
    figure.suptitle(f"packed vs {other}: accuracy and loss against {counted(metric_of(runs))} and time (band: the "
                    f"seeds' range)")
    figure.tight_layout()
    with atomic_open(path, "wb") as f:  # a file object: matplotlib would take a gs:// path for a local one
        figure.savefig(f, dpi=100, format=os.path.splitext(path)[1][1:] or "png")
    plt.close(figure)


def throughput_lines(path: str, metric: str = "mlm_accuracy") -> list[str]:
    """The packed speed-ups of a throughput benchmark's --output_json file (advice(metric)'s:
    scripts/benchmark_training.py's, a line a model config; benchmark_finetuning.py's, a line a
    task).

    Raises:
      RunError: the file is missing or not such a measurement.
    """
    script = advice(metric)[0]
    what = "config" if metric == "mlm_accuracy" else "task"
    lines, name = [], None
    try:
        with files.open_file(path) as f:
            measured = json.load(f)
        for name, result in measured.items():
            lines.append(_throughput_line(result, f"{name} {what}", script))
        return lines
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise_if_retryable(e)
        raise RunError(f"{path}: not a {script} --output_json measurement ("
                       + (f"{str(name)[:40]}: " if name is not None else "") + f"{type(e).__name__}: {e})") from None


def _throughput_line(result: dict, measured: str, script: str) -> str:
    """throughput_lines' line of one result (`measured`: its config or task, named).

    Raises:
      ValueError, KeyError, TypeError: the result is no such measurement, or holds figures no
        measurement gives (a speed-up of 0 or NaN, a padding efficiency above 1).
    """
    if "token_speedups" not in result:  # measured before real tokens/s were
        speedups, factor = result["speedups"]["packed"], result["packing_factor"]
        _measured_figures("speed-up", speedups)
        _measured_figures("packing factor", [factor])
        return (f"throughput in sequences/s (measured before real tokens/s were), {measured}, alternated in one "
                f"process ({script}): packed {describe_speedup(speedups, factor)}")
    for mode, figures in result["modes"].items():
        _measured_figures(f"{mode}'s padding efficiency", figures["padding_efficiency"], most=1.0)
    speedups, promised = token_speedup(result)
    _measured_figures("speed-up", speedups)
    baseline = baseline_of(result)
    if baseline == "packed":
        raise ValueError("its speed-ups are against packed itself: none of packing to quote")
    against = "" if baseline in ("padded", "unpacked") else f" against {baseline}"
    return (f"throughput in real tokens/s, {measured}, alternated ({script}): packed{against} "
            f"{describe_speedup(speedups, promised, TOKENS_PROMISE)}")


def _measured_figures(what: str, values: list, most: float = math.inf) -> None:
    """Refuses `values` (a measurement's `what`) that are no such figures: none, or any not a
    number above 0 and at most `most`."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"no {what} figures")
    for value in values:
        if not (is_number(value) and math.isfinite(value) and 0 < value <= most):
            raise ValueError(f"{what} {repr(value)[:40]} is not a figure a measurement gives")
