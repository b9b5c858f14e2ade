"""An exported update program compiled and run by JAX's XLA: checked, timed and compared.

Each configuration of an export (export.py) is measured in one call of `measure`, meant for a
process of its own that nothing else shares the device with (its memory and its peak are then
its own): its programs are compiled (with the GPU's autotuning, which XLA caches when XLA_FLAGS
names a cache directory: `compile_only`, in processes of their own beforehand, fills the cache,
so that here nothing autotunes), checked against their layouts, and run:
  1. checked configurations only: each slot's loss at the starting weights (the losses program)
     and one update from the starting state (NumPy's draw, as TensorFlow's was), both held against
     TensorFlow's outputs;
  2. the update from weights drawn on the device (normal, 0.02; LayerNorm scales 1), `warmup`
     calls, then `calls` timed calls, each call's outputs the next call's state (the donated
     buffers are written in place);
  3. the compiled program's bytes and the device's peak.
"""

from __future__ import annotations

import re
import statistics
import time

import jax
import numpy as np

from bert_packed.update_program import export
from bert_packed.update_program.export import Configuration, ExportError, Layout

# fp32 here is TensorFlow's float32 with its products at full precision (TensorFloat-32 off);
# bf16, Keras' mixed_bfloat16 (float32 weights, bf16 products). The largest difference allowed,
# TensorFlow's outputs on the CPU against this XLA's:
#   slot_losses  each sequence's loss at the starting weights, relative to it
#   outputs      the update's learning rate, sums and gradient norm, relative to each
#   state        each updated weight and slot, its norm and its sum (export.summary_difference)
#   elements     a fixed sample of each one's elements, relative to its root mean square
# In fp32 the elements differ most: a bias that starts at 0 takes LAMB's first step
# lr * g / (|g| + epsilon) element by element, and where |g| is near epsilon (1e-6) the step
# follows the last bits of g, which two XLA builds sum in other orders (2.4e-5 of the root mean
# square between TensorFlow 2.21's XLA and JAX 0.10's, both on this CPU; norms and sums 1.6e-6).
# bf16 keeps 8 significant bits: a product rounds by up to 2^-9 of itself, in an order that
# differs from kernel to kernel, so a loss summed over a sequence's predictions moves by about
# 1e-2. Its elements are reported, not held: LAMB's first step moves a weight by about lr times
# the sign of its gradient, so every gradient element that rounding brings to the other side of 0
# moves its weight by 2 lr the other way (0.71 of the root mean square, mini's largest between the
# two XLA builds on this CPU, whose norms and sums stayed within 9e-3).
TOLERANCES = {"fp32": {"slot_losses": 1e-4, "outputs": 1e-4, "state": 1e-4, "elements": 1e-3},
              "bf16": {"slot_losses": 2e-2, "outputs": 5e-2, "state": 2e-2, "elements": None}}
# Packed against padded, each sequence's loss (the same as scripts/device_check.py's).
PACKED_TOLERANCES = {"fp32": 1e-5, "bf16": 2e-2}
ALIAS = re.compile(r"\{(\d+)\}: \((\d+), \{\}, (?:may|must)-alias\)")



def worker_start() -> None:
    """A worker process's set-up: int64 (the optimizer's iteration count)."""
    jax.config.update("jax_enable_x64", True)


def compile_program(serialized: bytes):
    """The loaded executable of a serialized HLO module, for the first device."""
    from jax._src.lib import xla_client

    module = xla_client._xla.mlir.hlo_to_stablehlo(serialized)
    return jax.devices()[0].client.compile_and_load(module, jax.devices()[:1], xla_client.CompileOptions())


def check_program(serialized: bytes, layout: Layout, path: str) -> None:
    """Raises ExportError naming `path` unless the module takes exactly the layout's parameters
    (shapes, dtypes) and aliases each written one to the layout's output."""
    from jax._src.lib import xla_client

    try:
        computation = xla_client.XlaComputation(serialized)
        program_shape = computation.program_shape()
    except Exception as e:  # noqa: BLE001 - XLA's words for bytes that are no HLO module vary
        raise ExportError(f"{path}: not an HLO module ({_one_line(e)})") from None
    shapes = program_shape.parameter_shapes()
    if len(shapes) != len(layout.parameters):
        raise ExportError(f"{path}: the program takes {len(shapes)} parameters, its layout lists "
                          f"{len(layout.parameters)}")
    for index, (shape, parameter) in enumerate(zip(shapes, layout.parameters)):
        if tuple(shape.dimensions()) != parameter.shape or np.dtype(shape.numpy_dtype()).name != parameter.dtype:
            raise ExportError(f"{path}: parameter {index} ({parameter.name}) is {shape} in the program, "
                              f"{parameter.dtype}{list(parameter.shape)} in its layout")
    result = program_shape.result_shape()
    outputs = len(result.tuple_shapes()) if result.is_tuple() else 1
    if outputs != len(layout.outputs):
        raise ExportError(f"{path}: the program has {outputs} outputs, its layout names {len(layout.outputs)}")
    header = computation.as_hlo_text().split("\n", 1)[0]
    aliased = {int(parameter): int(output) for output, parameter, in ALIAS.findall(header)}
    expected = {index: p.output for index, p in enumerate(layout.parameters) if p.output is not None}
    if aliased != expected:
        raise ExportError(f"{path}: the program writes {len(aliased)} parameters in place, its layout "
                          f"{len(expected)}, or others")


def draw_on_device(layout: Layout, features: dict, seed: int) -> list:
    """The parameters of a first call, the weights drawn on the device (export.draw's rule, with
    JAX's generator: other values, the same distribution)."""
    key = jax.random.key(seed)
    values = []
    for index, parameter in enumerate(layout.parameters):
        if parameter.role == "weight" and parameter.init == "normal":
            normal = jax.random.normal(jax.random.fold_in(key, index), parameter.shape, np.float32)
            values.append((normal * export.NORMAL_STDDEV).astype(parameter.dtype))
        elif parameter.role == "feature":
            values.append(jax.device_put(np.asarray(features[parameter.name], parameter.dtype)))
        else:
            values.append(jax.device_put(export.draw(parameter, seed)))
    return values


def call(executable, layout: Layout, arguments: list) -> tuple[dict, list]:
    """One call: ({output name: value}, the next call's arguments: each written parameter's new
    value in place of the donated one)."""
    outputs = executable.execute(arguments)
    following = list(arguments)
    for index, parameter in layout.state():
        following[index] = outputs[parameter.output]
    return dict(zip(layout.outputs, outputs)), following


def relative(got, want) -> float:
    """The largest |got - want| relative to |want| (at least 1e-30), elementwise."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30), initial=0.0))


def check_against_tensorflow(directory: str, configuration: Configuration, executable, layout: Layout,
                             features: dict) -> dict:
    """Part 1: the losses and one update from the starting state, against TensorFlow's outputs."""
    reference = export.read_reference(directory, configuration)
    unknown = sorted((set(reference["state"]) | set(reference["outputs"])) - set(layout.outputs))
    if unknown:
        raise ExportError(f"{directory}/{configuration.name}/reference.json: names outputs the program's layout has "
                          f"not ({unknown[0]})")
    serialized, losses_layout = export.read_program(directory, configuration, "losses")
    check_program(serialized, losses_layout, f"{directory}/{configuration.name}/losses.hlo.pb.xz")
    export.check_batch(features, losses_layout, f"{directory}/{configuration.name}/batch.npz")
    losses_executable = compile_program(serialized)
    arguments = [jax.device_put(v) for v in export.initial_values(losses_layout, features, configuration.seed)]
    slot_losses = np.asarray(losses_executable.execute(arguments)[0])
    arguments = [jax.device_put(v) for v in export.initial_values(layout, features, configuration.seed)]
    outputs, _ = call(executable, layout, arguments)
    sizes = {p.name: int(np.prod(p.shape)) for p in layout.parameters}
    state = {name: export.summary_difference(export.summary(name, np.asarray(outputs[name])), want, sizes[name])
             for name, want in reference["state"].items()}
    figures = {"slot_losses": relative(slot_losses, reference["slot_losses"]),
               "outputs": max(relative(np.asarray(outputs[name]), value) for name, value in reference["outputs"].items()),
               "tensors": len(state)}
    for part, name in ((0, "state"), (1, "elements")):
        worst = max(state, key=lambda tensor: state[tensor][part])
        figures[name], figures[f"worst_{name}"] = state[worst][part], worst
    bounds = TOLERANCES[configuration.precision]
    figures["passed"] = all(figures[name] <= bound for name, bound in bounds.items() if bound is not None)
    figures["tolerances"] = bounds
    figures["sequence_losses"] = export.sequence_losses(slot_losses, export.read_batch(directory, configuration)[1])
    return figures


def time_update(executable, layout: Layout, arguments: list, warmup: int, calls: int) -> dict:
    """Part 2: seconds of each timed call, the state threaded from call to call."""
    for _ in range(warmup):
        outputs, arguments = call(executable, layout, arguments)
        jax.block_until_ready(outputs)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        outputs, arguments = call(executable, layout, arguments)
        jax.block_until_ready(outputs)
        seconds.append(time.perf_counter() - start)
    last = {name: float(np.asarray(value)) for name, value in outputs.items() if np.ndim(value) == 0}
    return {"seconds": seconds, "median_seconds": statistics.median(seconds), "last_outputs": last}


def memory(executable) -> dict:
    """Part 3: the compiled program's bytes (arguments + outputs + temporaries - aliased) and,
    where the device counts them, the process's peak and the device's limit."""
    stats = executable.get_compiled_memory_stats()
    figures = {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
               "temporaries": stats.temp_size_in_bytes, "aliased": stats.alias_size_in_bytes}
    figures["compiled"] = figures["arguments"] + figures["outputs"] + figures["temporaries"] - figures["aliased"]
    device = jax.devices()[0].memory_stats() or {}
    figures["peak"] = device.get("peak_bytes_in_use")
    figures["limit"] = device.get("bytes_limit")
    return figures


def compile_only(directory: str, name: str) -> dict:
    """A configuration's update program checked against its layout and compiled (its autotuning
    cached): {"compile_seconds", "memory"}, or {"error": one line}."""
    try:
        (executable, seconds), _, _ = _compiled(directory, name)
        return {"compile_seconds": seconds, "memory": memory(executable)}
    except ExportError as e:
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001 - XLA's refusals end this configuration only
        return {"error": _one_line(e)}


def _compiled(directory: str, name: str):
    """((the update's executable, seconds to compile), its configuration, its layout)."""
    configuration = export.read_manifest(directory)[1][name]
    serialized, layout = export.read_program(directory, configuration, "update")
    check_program(serialized, layout, f"{directory}/{name}/update.hlo.pb.xz")
    start = time.perf_counter()
    executable = compile_program(serialized)
    return (executable, time.perf_counter() - start), configuration, layout


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"


def measure(directory: str, name: str, warmup: int, calls: int) -> dict:
    """Every figure of one configuration (module docstring); {"error": one line} when it cannot
    run (its files, a program that does not match its layout, a device too small)."""
    figures = {"name": name}
    try:
        (executable, figures["compile_seconds"]), configuration, layout = _compiled(directory, name)
        features, _ = export.read_batch(directory, configuration)
        export.check_batch(features, layout, f"{directory}/{name}/batch.npz")
        figures["memory"] = memory(executable)
        if not figures["memory"]["aliased"]:
            raise ExportError(f"{directory}/{name}/update.hlo.pb.xz: XLA aliases no parameter to an output: the "
                              f"state would not be updated in place")
        limit = figures["memory"]["limit"]
        if limit and figures["memory"]["compiled"] > limit:
            return {**figures, "error": f"needs {figures['memory']['compiled'] / 2**30:.1f} GiB, the device has "
                                        f"{limit / 2**30:.1f} GiB"}
        if configuration.checked:
            figures["check"] = check_against_tensorflow(directory, configuration, executable, layout, features)
        arguments = draw_on_device(layout, features, configuration.seed)
        figures["time"] = time_update(executable, layout, arguments, warmup, calls)
        del arguments
        figures["memory"] = memory(executable)
    except ExportError as e:
        figures["error"] = str(e)
    except Exception as e:  # noqa: BLE001 - XLA's refusals (a device too small, say) end this configuration only
        figures["error"] = _one_line(e)
    return figures
