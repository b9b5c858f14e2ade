"""Comparing training runs: accuracy and loss curves, time to accuracy, realized speed-up.

A run is an output_dir of run_pretraining.py (or of a fine-tuning command: run_classifier's
accuracy, run_squad's F1 take the MLM accuracy's place), read through bert_packed.storage.run_directory (so runs on
gs:// compare as local ones do): its train and eval logs and run.json. Runs whose names differ
only in a trailing seed ("packed_seed1", "packed_seed2") are one configuration: drawn as the
seeds' mean with their range as a band, tabled as mean and range.
"""

from __future__ import annotations

import dataclasses
import os
import re

from bert_packed.reports.speedups import ABOVE_THE_FACTOR
from bert_packed.storage import files
from bert_packed.storage.run_directory import EVAL_LOG, TRAIN_LOG, RunDirectory, RunError

# What a run's curves follow, by the first key its logs hold: pre-training's MLM accuracy,
# run_squad's F1, run_classifier's accuracy; and how tables and plots name it.
METRICS = {"mlm_accuracy": "MLM accuracy", "f1": "F1", "accuracy": "accuracy"}
# What each kind of run is measured and repeated by: the script that measures its throughput
# alternately in one process, and the job that runs its configurations with several seeds.
PRETRAINING_ADVICE = ("scripts/benchmark_training.py",
                      "make experiments runs three seeds of each configuration and five of the baseline, for bands")
FINE_TUNING_ADVICE = ("scripts/benchmark_finetuning.py",
                      "make finetune FINETUNE_FLAGS=--seeds=1,2,3 runs three seeds of each, for bands")


# A fine-tuning evaluation at chance: its loss within this share of what a model that learned
# nothing scores (the log of the number of classes; a span's start and end uniform over its own
# tokens), or its accuracy no more than always answering the dev set's commonest class.
CHANCE_LOSS_SHARE = 0.01
AT_CHANCE_ADVICE = ("a rate too high is the usual cause (the tiny model collapsed at 1e-3 and once at 3e-4, not "
                    "at 1e-4): try a lower --learning_rate or a longer warm-up (--warmup_proportion)")


def at_chance(evals: list[dict]) -> str | None:
    """What a fine-tuning run's evaluations say when every one of their second half is at chance
    (CHANCE_LOSS_SHARE), in words; None when one is not, and for runs whose evaluations carry no
    chance figures (pre-training's, a regression's).

    >>> print(at_chance([{"loss": 0.6932, "accuracy": 0.5, "chance_loss": 0.6931, "chance_accuracy": 0.5}] * 4))
    its last 2 evaluations stayed at chance (accuracy 0.5000, the commonest class 0.5000; loss 0.6932, at chance 0.6931)
    >>> at_chance([{"loss": 0.69, "chance_loss": 0.6931}, {"loss": 0.31, "chance_loss": 0.6931}]) is None
    True
    >>> at_chance([{"loss": 0.01, "accuracy": 1.0, "chance_loss": 0.6931, "chance_accuracy": 1.0}] * 2) is None
    True
    >>> at_chance([{"loss": None, "accuracy": 0.5, "chance_loss": 0.6931, "chance_accuracy": 0.5}]) is None
    True
    """
    half = evals[len(evals) // 2:]
    figures_of = ("loss", "chance_loss", "accuracy", "chance_accuracy")
    if not half or not all("chance_loss" in record and all(is_number(record[key]) for key in figures_of if key in record)
                           for record in half):
        return None  # no chance figures, or figures edited into what no evaluation writes: cannot tell

    def chance(record):
        learned_nothing = "loss" in record and (abs(record["loss"] - record["chance_loss"])
                                                <= CHANCE_LOSS_SHARE * record["chance_loss"])
        # A dev set of one class tells nothing by accuracy: the commonest class is every answer.
        majority = ("accuracy" in record and record.get("chance_accuracy", 1.0) < 1.0
                    and record["accuracy"] <= record["chance_accuracy"] + 1e-9)
        return learned_nothing or majority

    if not all(chance(record) for record in half):
        return None
    last, figures = half[-1], []
    if "chance_accuracy" in last and "accuracy" in last:
        figures.append(f"accuracy {last['accuracy']:.4f}, the commonest class {last['chance_accuracy']:.4f}")
    if "loss" in last:
        figures.append(f"loss {last['loss']:.4f}, at chance {last['chance_loss']:.4f}")
    what = "evaluation" if len(half) == 1 else f"{len(half)} evaluations"
    return f"its last {what} stayed at chance ({'; '.join(figures)})"


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def at_chance_warning(directory: RunDirectory) -> str | None:
    """The line a fine-tuning run that learned nothing ends with (at_chance), or None."""
    chance = at_chance(directory.read_log(EVAL_LOG))
    return f"{directory.path}: {chance}: it learned nothing; {AT_CHANCE_ADVICE}" if chance else None


# A speed-up beyond the packing factor: marked so wherever one is shown, and said why it may be.
def runs_have(names: list[str]) -> str:
    """The names as a sentence's subject: "a has", "a, b have"."""
    return f"{', '.join(names)} {'has' if len(names) == 1 else 'have'}"


def counted(metric: str) -> str:
    """What a run of `metric` counts: pre-training's sequences, fine-tuning's examples."""
    return "sequences" if metric == "mlm_accuracy" else "examples"


def advice(metric: str) -> tuple[str, str]:
    """(the throughput benchmark, the several-seeds job) of runs that follow `metric`."""
    return PRETRAINING_ADVICE if metric == "mlm_accuracy" else FINE_TUNING_ADVICE


@dataclasses.dataclass
class Run:
    """One run's logs.

    Attributes:
      name: label in plots and tables.
      train: train_log.jsonl records.
      evals: eval_log.jsonl records (may be empty).
      info: run.json (input_mode, packing_factor, ...), {} if absent.
      directory: where the logs are.
      metric: the figure its curves and targets follow (METRICS: a pre-training run's MLM
        accuracy, a fine-tuning run's accuracy, or SQuAD's F1).
    """

    name: str
    train: list[dict]
    evals: list[dict]
    info: dict
    directory: str = ""
    metric: str = "mlm_accuracy"

    @property
    def train_seconds(self) -> float:
        """Seconds spent training, evaluations left out (a log without train_seconds: all its seconds)."""
        last = self.train[-1]
        return last.get("train_seconds", last["seconds"])

    @property
    def sequences_per_update(self) -> float:
        """Sequences an update held, on average over the run (its log's; micro-steps are counted
        in steps, updates in steps_per_update of them)."""
        last = self.train[-1]
        return last["sequences"] * self.info.get("steps_per_update", 1) / last["step"]

    @property
    def sequences_per_second(self) -> float:
        return self.train[-1]["sequences"] / self.train_seconds

    @property
    def real_tokens_per_second(self) -> float:
        return sum(r.get("real_tokens", 0.0) for r in self.train) / self.train_seconds

    def reach(self, accuracy: float) -> dict | None:
        """The first evaluation at or above `accuracy` (its step, sequences and seconds)."""
        return next((r for r in self.evals if r.get(self.metric, 0.0) >= accuracy), None)


def load_run(directory: str, name: str | None = None) -> Run:
    """Reads a run directory.

    Raises:
      RunError: the directory or its train_log.jsonl is missing, empty or damaged; its log has
        no update or no training time; its evaluations scored nothing (run_squad's of a predict
        file without answers).
    """
    if not files.isdir(directory):
        raise RunError(f"{directory}: no such run directory")
    run = RunDirectory(directory)
    train = run.read_log(TRAIN_LOG)
    if not train:
        raise RunError(f"{directory}: no {TRAIN_LOG} records (expected a run_pretraining.py output_dir)")
    last = train[-1]
    if not last.get("step") or not last.get("train_seconds", last.get("seconds")):
        raise RunError(f"{directory}: its {TRAIN_LOG} ends at step {last.get('step')} after "
                       f"{last.get('train_seconds', last.get('seconds'))} s of training: no update to compare")
    evals, info = run.read_log(EVAL_LOG), run.read_info()
    # A run without evaluations says its kind in run.json: run_squad's records doc_stride, run_classifier's the task.
    kind = "f1" if "doc_stride" in info else "accuracy" if "task_name" in info else "mlm_accuracy"
    metric = next((key for key in METRICS if any(key in record for record in evals or train)), kind)
    if evals and not any(metric in record or "loss" in record for record in evals):
        raise RunError(f"{directory}: its evaluations scored nothing (no {METRICS[metric]}, no loss: a predict file "
                       f"without answers?), so there is no curve to compare")
    return Run(name or os.path.basename(os.path.normpath(directory)), train, evals, info, directory, metric)


def metric_of(runs: list[Run]) -> str:
    """The figure the runs are compared by (Run.metric), one for all.

    Raises:
      RunError: runs that follow different figures (pre-training beside fine-tuning, say).
    """
    metrics = {run.metric for run in runs}
    if len(metrics) > 1:
        raise RunError("the runs follow different figures (" + ", ".join(
            f"{run.directory or run.name}: {METRICS[run.metric]}" for run in runs) + "); compare runs of one kind")
    return metrics.pop()


def configuration_name(name: str) -> str:
    """A run's configuration: its name without a trailing seed ("packed_seed2" -> "packed")."""
    return re.sub(r"[_-]seed\d+$", "", name)


@dataclasses.dataclass
class Configuration:
    """The runs of one configuration, one a seed."""

    name: str
    runs: list[Run]

    def mean(self, value) -> float | None:
        """The mean over the seeds of value(run); None when it is None for any seed."""
        values = [value(run) for run in self.runs]
        return None if any(v is None for v in values) else sum(values) / len(values)

    def spread(self, value) -> tuple[float, float] | None:
        """The seeds' (min, max) of value(run); None when it is None for any seed."""
        values = [value(run) for run in self.runs]
        return None if any(v is None for v in values) else (min(values), max(values))

    def points(self, source: str) -> list[tuple[float, float, list[float], list[float]]]:
        """(sequences, mean seconds, accuracies, losses) along the seeds' eval (or train) records.

        The seeds' records fall at slightly different sequence counts (a packed update holds a
        varying number of sequences), so every seed is read, linearly, at the sequence counts of
        the seed with the fewest records; a count past a seed's last record takes its last value.
        """
        curves = [run.evals if source == "eval" else run.train for run in self.runs]
        grid = [record["sequences"] for record in min(curves, key=len)]

        def at(curve, key, sequences):
            return _interpolate([(r["sequences"], r.get(key, 0.0)) for r in curve], sequences, clamp=True)

        return [(x, sum(at(c, "seconds", x) for c in curves) / len(curves),
                 [at(c, self.runs[0].metric, x) for c in curves], [at(c, "loss", x) for c in curves]) for x in grid]


def group_runs(runs: list[Run]) -> list[Configuration]:
    """Runs grouped by configuration, in the order each first appears.

    A configuration is a run's directory and name without a trailing seed: runs/a/packed_seed1
    and runs/a/packed_seed2 are one, runs/b/packed_seed1 another (named by its path when the
    names alone would clash).

    Raises:
      RunError: two seeds of one configuration differ in run.json beyond the seed.
    """
    groups: dict[str, list[Run]] = {}
    for run in runs:
        parent = os.path.dirname(os.path.normpath(run.directory)) if run.directory else ""
        groups.setdefault(os.path.join(parent, configuration_name(run.name)), []).append(run)
    names = [configuration_name(members[0].name) for members in groups.values()]
    configurations = []
    for (key, members), name in zip(groups.items(), names):
        first = {k: v for k, v in members[0].info.items() if k != "seed"}
        for other in members[1:]:
            differ = sorted(k for k in set(first) | set(other.info) if k != "seed"
                            and first.get(k) != other.info.get(k))
            if differ:
                raise RunError(f"{members[0].directory} and {other.directory} look like seeds of one configuration, "
                               f"but their run.json differ in {', '.join(differ)}")
        configurations.append(Configuration(key if names.count(name) > 1 else name, members))
    return configurations


def _interpolate(points: list[tuple[float, float]], x: float, clamp: bool = False) -> float | None:
    """The polyline through `points` (x ascending) at x; outside them None, or with `clamp` the
    nearest end's value."""
    if not points:
        return None
    if x <= points[0][0] or x >= points[-1][0]:
        end = points[0] if x <= points[0][0] else points[-1]
        return end[1] if clamp or x == end[0] else None
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def value_at(run: Run, key: str, sequences: float) -> float | None:
    """The run's eval `key` at `sequences`, linear between its evaluations; within one update
    before its first or after its last (an evaluation falls up to an update late), that one's;
    further outside, None."""
    points = [(r["sequences"], r.get(key, 0.0)) for r in run.evals]
    counts = [r["sequences"] for r in run.train]
    update = max((b - a for a, b in zip(counts, counts[1:])), default=0)
    if points and points[0][0] - update <= sequences <= points[-1][0] + update:
        return _interpolate(points, sequences, clamp=True)
    return None


def at_sequences_table(runs: list[Run], sequences: float) -> str:
    """Markdown table: each configuration's updates as they are held (sequences, real tokens and
    predictions an update, means over its seeds) and its eval loss and accuracy at `sequences`
    (the seeds' mean and range), with the distance outside the baseline seeds' range."""
    groups = group_runs(runs)

    def mean_of(group, key):
        return group.mean(lambda run: sum(r.get(key, 0.0) for r in run.train) / len(run.train))

    def spread(group, key):
        values = [value_at(run, key, sequences) for run in group.runs]
        return None if None in values else (sum(values) / len(values), min(values), max(values))

    metric = metric_of(runs)
    baseline = {key: spread(groups[0], key) for key in ("loss", metric)}
    lines = [f"| configuration | seeds | sequences an update | real tokens an update | predictions an update | "
             f"eval loss at {sequences:,.0f} | below the baseline's range by | {METRICS[metric]} at {sequences:,.0f} |",
             "|---|---|---|---|---|---|---|---|"]
    for group in groups:
        loss, accuracy = spread(group, "loss"), spread(group, metric)
        below = "-" if loss is None or baseline["loss"] is None else f"{max(baseline['loss'][1] - loss[0], 0.0):.4f}"
        lines.append(f"| {group.name} | {len(group.runs)} | {mean_of(group, 'num_sequences'):.2f} | "
                     f"{mean_of(group, 'real_tokens'):,.0f} | {mean_of(group, 'predictions'):,.1f} | "
                     + ("-" if loss is None else f"{loss[0]:.4f} ({loss[1]:.4f}-{loss[2]:.4f})") + f" | {below} | "
                     + ("-" if accuracy is None else f"{accuracy[0]:.4f} ({accuracy[1]:.4f}-{accuracy[2]:.4f})") + " |")
    return "\n".join(lines)


def inside_baseline_spread(baseline: Configuration, other: Configuration) -> dict | None:
    """At each evaluation of the baseline, where `other`'s mean figure (interpolated at the
    baseline's sequences) lies against the baseline seeds' range. Seeds at chance (at_chance) are
    left out of both; None when fewer than two baseline seeds, or no seed of `other`, are left.

    Returns:
      {"compared", "inside", "above", "below": evaluations, "most_above", "most_below": the
      largest distance outside the range each way, "left_out": the seeds at chance}.
    """
    left_out = [run.name for run in baseline.runs + other.runs if at_chance(run.evals)]
    kept = Configuration(baseline.name, [run for run in baseline.runs if run.name not in left_out])
    others = [run for run in other.runs if run.name not in left_out]
    if len(kept.runs) < 2 or not others:
        return None
    verdict = {"compared": 0, "inside": 0, "above": 0, "below": 0, "most_above": 0.0, "most_below": 0.0,
               "left_out": left_out}
    for sequences, _, figures, _ in kept.points("eval"):
        values = [value_at(run, run.metric, sequences) for run in others]
        if any(v is None for v in values):
            continue
        mean = sum(values) / len(values)
        verdict["compared"] += 1
        if mean > max(figures):
            verdict["above"] += 1
            verdict["most_above"] = max(verdict["most_above"], mean - max(figures))
        elif mean < min(figures):
            verdict["below"] += 1
            verdict["most_below"] = max(verdict["most_below"], min(figures) - mean)
        else:
            verdict["inside"] += 1
    return verdict if verdict["compared"] else None


def describe_spread(verdict: dict | None) -> str:
    """inside_baseline_spread's verdict in a table cell.

    >>> describe_spread({"compared": 7, "inside": 5, "above": 2, "below": 0, "most_above": 0.0381,
    ...                  "most_below": 0.0, "left_out": ["padded_seed2"]})
    'inside at 5 of 7; above at 2, by up to 0.03810 (padded_seed2 at chance: left out)'
    """
    if verdict is None:
        return "-"
    parts = [f"inside at {verdict['inside']} of {verdict['compared']}"]
    for side in ("above", "below"):
        if verdict[side]:
            parts.append(f"{side} at {verdict[side]}, by up to {verdict[f'most_{side}']:.5f}")
    left_out = f" ({', '.join(verdict['left_out'])} at chance: left out)" if verdict["left_out"] else ""
    return "; ".join(parts) + left_out


def first_and_final(runs: list[Run]) -> tuple[float, float]:
    """The highest first evaluation of the runs, and their lowest final one (of their metric)."""
    return (max(run.evals[0].get(run.metric, 0.0) for run in runs),
            min(run.evals[-1].get(run.metric, 0.0) for run in runs))


def automatic_accuracy(runs: list[Run]) -> float | None:
    """A target that every run reaches and none meets at its first evaluation, so that the runs
    are told apart by how fast they rise: 90% of the way from the highest first evaluation to the
    lowest final one (0.0954 and 0.1054 give 0.1044). None when the curves do not rise past every
    first evaluation (flat): no time to a target would mean anything."""
    first, final = first_and_final(runs)
    return first + 0.9 * (final - first) if final > first else None


def figures_source(runs: list[Run]) -> str:
    """"eval" when every run has evaluations, else "train": one source for every figure compared."""
    return "eval" if all(run.evals for run in runs) else "train"


def summary_table(runs: list[Run], accuracy: float | None) -> list[dict]:
    """One row a configuration (its seeds' mean, and their range); speed-ups are of the means,
    against the first configuration (the baseline).

    Columns: configuration, seeds, input mode, packing factor, sequences an update, final
    accuracy and loss (eval, at each run's last step; train figures when a run has no
    evaluations), sequences and seconds (evaluations included, as MLPerf times) to reach
    `accuracy` (None unless every seed reaches it), sequences/s and real tokens/s (training time
    only), throughput speed-up, time-to-accuracy speed-up, the throughput speed-up divided by the
    ratio of packing factors, and with several baseline seeds how many of the baseline's
    evaluations have this configuration inside their range. No `accuracy`: no to-target figures.
    """
    groups = group_runs(runs)
    baseline = groups[0]
    metric = metric_of(runs)
    source = figures_source(runs)

    def final(key):
        return lambda run: (run.evals if source == "eval" else run.train)[-1].get(key)

    def reached(key):
        return lambda run: (run.reach(accuracy) or {}).get(key) if accuracy is not None else None

    base_speed = baseline.mean(lambda run: run.sequences_per_second)
    base_seconds = baseline.mean(reached("seconds"))
    base_factor = baseline.runs[0].info.get("packing_factor", 1.0)
    rows = []
    for group in groups:
        info = group.runs[0].info
        speedup = group.mean(lambda run: run.sequences_per_second) / base_speed
        seconds = group.mean(reached("seconds"))
        inside = inside_baseline_spread(baseline, group) if group is not baseline and source == "eval" else None
        rows.append({
            "run": group.name,
            "seeds": len(group.runs),
            "input_mode": info.get("input_mode", "?"),
            "packing_factor": info.get("packing_factor", 1.0),
            "sequences_per_update": group.mean(lambda run: run.sequences_per_update),
            "metric": metric,
            "final_accuracy": group.mean(final(metric)),
            "final_accuracy_range": group.spread(final(metric)),
            "final_loss": group.mean(final("loss")),
            "sequences_to_accuracy": group.mean(reached("sequences")),
            "sequences_to_accuracy_range": group.spread(reached("sequences")),
            "seconds_to_accuracy": seconds,
            "seconds_to_accuracy_range": group.spread(reached("seconds")),
            "sequences_per_second": group.mean(lambda run: run.sequences_per_second),
            "real_tokens_per_second": group.mean(lambda run: run.real_tokens_per_second),
            "throughput_speedup": speedup,
            "time_to_accuracy_speedup": base_seconds / seconds if seconds and base_seconds else None,
            "speedup_over_packing_factor": speedup / (info.get("packing_factor", 1.0) / base_factor),
            "inside_baseline_spread": inside,
            "at_chance": [run.name for run in group.runs if at_chance(run.evals)],
        })
    return rows


def above_the_packing_factor(row: dict, baseline: dict) -> bool:
    """A clock speed-up beyond the ratio of packing factors: more than packing can give. Bucketed
    rows are shorter than L, so their speed-up has another bound: not judged."""
    return "bucketed" not in (row["input_mode"], baseline["input_mode"]) and row["speedup_over_packing_factor"] > 1.0


def format_table(rows: list[dict], accuracy: float | None) -> str:
    """Markdown table of summary_table rows: means, with the seeds' range where there are several;
    a clock speed-up above the packing factor marked so (verdict_notes says why it may be)."""

    def number(value, spec, spread=None):
        if value is None:
            return "-"
        if spread is None or spread[0] == spread[1]:
            return format(value, spec)
        return f"{format(value, spec)} ({format(spread[0], spec)}-{format(spread[1], spec)})"

    target = "target" if accuracy is None else f"{accuracy:.3f}"
    unit = counted(rows[0]["metric"])
    lines = [f"| configuration | seeds | input | packing factor | {unit} an update | final {METRICS[rows[0]['metric']]} | "
             f"final loss | {unit} to {target} | seconds to {target} | {unit}/s (own clock) | "
             f"real tokens/s (own clock) | speed-up by the runs' clocks | time-to-accuracy speed-up | "
             f"clock speed-up / packing factor | against the baseline's seed range, evaluation by evaluation |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        chance = f" (at chance: {', '.join(r['at_chance'])})" if r["at_chance"] else ""
        lines.append(
            f"| {r['run']}{chance} | {r['seeds']} | {r['input_mode']} | {r['packing_factor']:.3f} | "
            f"{number(r['sequences_per_update'], '.1f')} | "
            f"{number(r['final_accuracy'], '.4f', r['final_accuracy_range'])} | "
            f"{number(r['final_loss'], '.4f')} | "
            f"{number(r['sequences_to_accuracy'], ',.0f', r['sequences_to_accuracy_range'])} | "
            f"{number(r['seconds_to_accuracy'], '.1f', r['seconds_to_accuracy_range'])} | "
            f"{r['sequences_per_second']:.1f} | {r['real_tokens_per_second']:,.0f} | {r['throughput_speedup']:.2f}"
            f"{f' ({ABOVE_THE_FACTOR})' if above_the_packing_factor(r, rows[0]) else ''} | "
            f"{number(r['time_to_accuracy_speedup'], '.2f')} | {r['speedup_over_packing_factor']:.2f} | "
            f"{describe_spread(r['inside_baseline_spread'])} |")
    return "\n".join(lines)
