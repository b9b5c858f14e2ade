"""What a command shows on its console: the progress line of long jobs (progress.py) and TensorFlow
loaded quietly, its start-up notices off the console (tensorflow_loading.py), and the caller's root
logger kept around a command run as a function (root_logger.py)."""
