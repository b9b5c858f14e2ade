"""bert-packed: BERT pre-training with the MLPerf recipe on packed sequences."""

__version__ = "0.1.0"
