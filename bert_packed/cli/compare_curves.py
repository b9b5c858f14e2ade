"""Compare training runs: accuracy and loss curves (PNG) and a summary table.

    python scripts/compare_curves.py runs/sample/train_padded runs/sample/train_packed \
        --output runs/sample/curves.png --accuracy 0.05

The first run is the baseline for the speed-ups. Exit status 2 with one line on bad input.
"""

from __future__ import annotations

import argparse

from bert_packed.cli.common import fail_if_disk_full
from bert_packed.curves import RunError, format_table, load_run, plot, summary_table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="compare_curves", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run_pretraining.py output directories; the first is the baseline")
    parser.add_argument("--labels", default=None, help="comma-separated names for the runs")
    parser.add_argument("--output", default="compare_curves.png", help="where the PNG goes")
    parser.add_argument("--accuracy", default="0.720",
                        help="MLM accuracy for the sequences-and-time-to-accuracy columns (default 0.720); "
                             "'auto': 90%% of the lowest final eval accuracy among the runs")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [None] * len(args.runs)
    if len(labels) != len(args.runs):
        parser.exit(2, f"compare_curves: error: --labels has {len(labels)} names for {len(args.runs)} runs\n")
    try:
        runs = [load_run(directory, label) for directory, label in zip(args.runs, labels)]
    except RunError as e:
        parser.exit(2, f"compare_curves: error: {e}\n")
    if args.accuracy == "auto":
        finals = [run.evals[-1]["mlm_accuracy"] for run in runs if run.evals]
        if len(finals) < len(runs):
            parser.exit(2, "compare_curves: error: --accuracy auto needs an eval_log.jsonl in every run\n")
        accuracy = 0.9 * min(finals)
    else:
        try:
            accuracy = float(args.accuracy)
        except ValueError:
            parser.exit(2, f"compare_curves: error: --accuracy {args.accuracy!r}: expected a number or 'auto'\n")
    try:
        plot(runs, args.output)
    except OSError as e:
        fail_if_disk_full("compare_curves", e, args.output, "The runs are untouched")
        raise
    print(format_table(summary_table(runs, accuracy), accuracy))
    print(f"\ncurves: {args.output}")


if __name__ == "__main__":
    main()
