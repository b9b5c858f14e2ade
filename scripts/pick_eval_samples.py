"""The MLPerf eval set from a file of eval instances; see bert_packed/cli/pick_eval_samples.py."""

from bert_packed.cli.pick_eval_samples import entry_point

if __name__ == "__main__":
    entry_point()
