"""Text -> unpacked pre-training TFRecords; see bert_packed/cli/create_pretraining_data.py."""

from bert_packed.cli.create_pretraining_data import entry_point

if __name__ == "__main__":
    entry_point()
