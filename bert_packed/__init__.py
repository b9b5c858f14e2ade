"""bert-packed: BERT pre-training with the MLPerf recipe on packed sequences."""

import os

# TensorFlow's C++ INFO and WARNING lines (oneDNN notices, buffer sizes) stay off the console of
# code that uses the package, unless the user set the level (or a command's --verbosity=1).
TF_LOG_LEVEL_DEFAULTED = "TF_CPP_MIN_LOG_LEVEL" not in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
