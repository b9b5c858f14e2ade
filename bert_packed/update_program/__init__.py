"""TensorFlow's whole training update as a program that runs without TensorFlow.

What `jit_compile` hands XLA is device-neutral: exported where TensorFlow is
(scripts/export_update_programs.py, through bert_packed.training.export_update), it is compiled
and run by JAX's XLA on a GPU whose CUDA TensorFlow cannot use (scripts/device_check_xla.py).

  export.py  what an export holds, written and read back: each configuration's program, its
             parameters and what each is, a real micro-batch, TensorFlow's own outputs; starting
             weights drawn from a seed the same way on both sides; the summaries compared
  run.py     the program compiled, checked against its layout, run with its state donated,
             timed, and checked against TensorFlow's outputs (JAX)
  peer.py    the same sequences through Hugging Face transformers' BertForPreTraining (PyTorch)

No module here imports TensorFlow.
"""
