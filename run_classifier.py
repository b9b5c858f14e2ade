"""Fine-tune BERT on a GLUE task or your own, packed: python run_classifier.py --task_name=mrpc ... (see bert_packed/cli)."""

from bert_packed.cli.run_classifier import entry_point

if __name__ == "__main__":
    entry_point()
