"""The training step's memory (and time) on a GPU where TensorFlow is not installed, through JAX's XLA.

    python scripts/benchmark_memory.py --export_hlo=hlo                   # where TensorFlow is
    python scripts/measure_hlo_memory.py --hlo_dir=hlo --output_json=gpu.json [--time=KEY,...]
    python scripts/benchmark_memory.py --measurements=gpu.json --write_plan   # back where TensorFlow is

benchmark_memory.py --export_hlo writes the HLO of each configuration's compiled step (the program
TensorFlow hands XLA for update.Update._gradients, before XLA's passes). This script compiles each
with the XLA of the JAX installed here for this machine's first accelerator, and reads the bytes
of its buffer assignment: arguments (the weights and the batch), outputs (the gradients and the
sums) and temporaries (the activations among them). Compiled, not run; with autotuning off,
which changes no buffer but the matrix products' workspaces. With --time, the named
configurations are also compiled with autotuning and run on zeros (--calls times after two
warm-up calls): the forward and backward pass alone, without TensorFlow's optimizer update,
input pipeline or all-reduce.

It needs JAX (with the accelerator's plugin), NumPy and absl-py, and this checkout on PYTHONPATH (or
installed without its dependencies), not TensorFlow.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import lzma
import multiprocessing
import os
import statistics
import sys
import time

from absl import flags

from bert_packed.cli.common import run
from bert_packed.storage.files import write_text_atomically

PROGRAM = "measure_hlo_memory"
FLAGS = flags.FlagValues()
flags.DEFINE_string("hlo_dir", None, "What benchmark_memory.py --export_hlo wrote (manifest.json and the HLO files).",
                    flag_values=FLAGS)
flags.DEFINE_string("output_json", None, "Where the figures go (benchmark_memory.py --measurements reads them).",
                    flag_values=FLAGS)
flags.DEFINE_list("time", [], "Configurations (manifest keys) to run and time too.", flag_values=FLAGS)
flags.DEFINE_integer("calls", 10, "Timed calls of each --time configuration.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("workers", 8, "Processes compiling at once.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_list("first", [], "Configurations whose names start so are compiled first, in this order.", flag_values=FLAGS)
flags.mark_flags_as_required(["hlo_dir", "output_json"], flag_values=FLAGS)


def compile_hlo(path: str):
    """(the loaded executable, its argument shapes) of an HLO file, for the first device."""
    from jax._src.lib import xla_client

    from bert_packed.update_program.run import compile_program

    serialized = lzma.open(path).read()
    shapes = xla_client.XlaComputation(serialized).program_shape().parameter_shapes()
    return compile_program(serialized), shapes


def bytes_of(path: str) -> dict:
    """The buffer assignment's sizes of one HLO file, compiled without autotuning."""
    start = time.perf_counter()
    executable, _ = compile_hlo(path)
    stats = executable.get_compiled_memory_stats()
    return {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
            "temporaries": stats.temp_size_in_bytes, "aliased": stats.alias_size_in_bytes,
            "total": stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
            - stats.alias_size_in_bytes, "compile_seconds": time.perf_counter() - start}


def _worker_start() -> None:
    # Each process compiles only (before JAX loads): no GPU memory taken ahead for arrays it never
    # makes, and no autotuning, which times kernels and changes no buffer but workspaces.
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_gpu_autotune_level=0".strip()


def seconds_a_call(path: str, calls: int) -> dict:
    """Runs one HLO file's program on zeros: the median seconds a call, and all of them."""
    import jax
    import numpy as np

    executable, shapes = compile_hlo(path)
    arguments = [jax.device_put(np.zeros(shape.dimensions(), shape.numpy_dtype())) for shape in shapes]
    for _ in range(2):
        jax.block_until_ready(executable.execute(arguments))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(executable.execute(arguments))
        times.append(time.perf_counter() - start)
    return {"median_seconds": statistics.median(times), "seconds": times}


def fail(message: str) -> None:
    """One line and exit status 2, as the project's commands end on a user's error."""
    sys.stderr.write(f"measure_hlo_memory: error: {message}\n")
    sys.exit(2)


def main(argv) -> None:
    del argv
    manifest_path = os.path.join(FLAGS.hlo_dir, "manifest.json")
    if importlib.util.find_spec("jax") is None:
        fail("needs JAX with the accelerator's plugin (on an NVIDIA GPU: pip install "
                 "'jax[cuda13]' or 'jax[cuda12]', as the driver allows)")
    if not os.path.isfile(manifest_path):
        fail(f"--hlo_dir={FLAGS.hlo_dir}: no manifest.json; expected what "
                 f"scripts/benchmark_memory.py --export_hlo wrote")
    with open(manifest_path) as f:
        manifest = json.load(f)
    rank = lambda key: next((i for i, prefix in enumerate(FLAGS.first) if key.startswith(prefix)), len(FLAGS.first))
    paths = {key: os.path.join(FLAGS.hlo_dir, manifest[key]) for key in sorted(manifest, key=rank)}
    import jax

    device = jax.devices()[0]
    result = {"measured_by": f"XLA's buffer assignment for {device.device_kind} (JAX {jax.__version__}'s XLA)",
              "device": device.device_kind, "bytes": {}, "details": {}, "times": {}}
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(FLAGS.workers, mp_context=context, initializer=_worker_start) as pool:
        futures = {pool.submit(bytes_of, path): key for key, path in paths.items()}
        for done in concurrent.futures.as_completed(futures):
            key = futures[done]
            try:
                figures = done.result()
                result["bytes"][key] = figures["total"]
            except Exception as e:  # noqa: BLE001 - one configuration XLA refuses is reported, not fatal
                figures = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            result["details"][key] = figures
            write(result)  # each figure kept as it comes: a run stopped at its time limit keeps what it measured
            print(f"{key}: " + (figures["error"] if "error" in figures else
                                f"{figures['total'] / 2**30:.3f} GiB ({figures['compile_seconds']:.0f} s)"), flush=True)
    for key in FLAGS.time:
        try:
            result["times"][key] = seconds_a_call(paths[key], FLAGS.calls)
        except Exception as e:  # noqa: BLE001 - a configuration that does not fit is reported, not fatal
            result["times"][key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        timed = result["times"][key]
        print(f"{key}: " + (timed["error"] if "error" in timed else f"{timed['median_seconds'] * 1000:.1f} ms a call"),
              flush=True)
        write(result)


def write(result: dict) -> None:
    write_text_atomically(FLAGS.output_json, json.dumps(result, indent=1) + "\n")


def entry_point():
    run(main, PROGRAM, "output_json", "What was measured is in --output_json", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
