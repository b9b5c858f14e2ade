"""Export pre-trained weights (Hugging Face or TF1); see bert_packed/cli/export_model.py."""

from bert_packed.cli.export_model import entry_point

if __name__ == "__main__":
    entry_point()
