"""bert-packed: BERT pre-training (MLPerf BERT-Large recipe) on packed sequences."""

from setuptools import find_packages, setup

# What training needs besides TensorFlow itself (tensorflow-cpu does not bring TensorBoard).
TRAINING = ["tensorboard==2.21.*", "mlperf-logging>=3.0", "matplotlib>=3.7"]

setup(
    name="bert-packed",
    version="0.1.0",
    description="Pre-train BERT with the MLPerf recipe on packed sequences (TensorFlow/Keras).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["bert_packed", "bert_packed.*"]),
    install_requires=[
        "numpy>=1.26",
        "scipy>=1.11",
        "numba>=0.60",
        "tokenizers>=0.15",
        "absl-py>=2.0",
    ],
    extras_require={
        # TensorFlow comes only through an extra so that CPU machines never pull CUDA.
        "cpu": ["tensorflow-cpu==2.21.*", *TRAINING],
        "gpu": ["tensorflow[and-cuda]==2.21.*", *TRAINING],
        "test": ["pytest>=8", "hypothesis>=6.100"],
    },
    entry_points={
        "console_scripts": [
            "bert-packed-plan=bert_packed.cli.plan_packing:main",
        ],
    },
)
