"""A compiled step's update exported for an XLA without TensorFlow (bert_packed.update_program).

What `tf.function(jit_compile=True)` hands XLA, taken before XLA's passes, is device-neutral:
another XLA (JAX's, on a GPU whose CUDA TensorFlow cannot use) compiles and runs it. A program's
parameters are the function's arguments flattened (tf.nest's order: a dict's keys sorted), then
what the function captures, in its order: weights, the optimizer's slots and iteration count, the
schedule's values and the dropout seed. Its outputs are the returned values flattened, then the
new value of each variable the update writes, each aliased to that variable's parameter (XLA may
write it in place: a donated buffer). `program` reads all of this off the function and the HLO
module itself, so the layout file cannot disagree with the program.

export_configuration writes one configuration: Update.one_update (the loop's update of one
micro-batch) and, where TensorFlow's own outputs are carried, a program of each slot's loss at
the starting weights; then TensorFlow runs both on this machine from the starting weights that
bert_packed.update_program.export.draw gives, and keeps their summaries.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.compiler.xla import xla_data_pb2
from tensorflow.compiler.xla.service import hlo_pb2

from bert_packed.errors import InternalError
from bert_packed.training.step import CompiledStep
from bert_packed.update_program import export
from bert_packed.update_program.export import Configuration, Layout, Parameter

# XLA's element types as NumPy names (those a training step's parameters take).
DTYPES = {"PRED": "bool", "S32": "int32", "S64": "int64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
          "U8": "uint8", "U32": "uint32"}


def weight_init(path: str) -> str:
    """How a weight starts in an export: LayerNorm's scales at 1, biases and offsets at 0, the
    rest normal (export.draw)."""
    name = path.rsplit("/", 1)[-1]
    return "ones" if name == "gamma" else "zeros" if name in ("beta", "bias") or name.endswith("_bias") else "normal"


def _variables(step: CompiledStep) -> dict[int, tuple[str, str, tf.Variable]]:
    """{id of a variable's handle: (role, name, variable)} of everything a program of `step` may
    capture. Named without the model's own name, which Keras numbers by the models built before
    in the process (bert_pretraining_model_1/...): the name draws a weight's starting values."""
    model = step.model.name
    found = {}
    for variable in step.model.variables:
        found[id(variable.value.handle)] = ("weight", variable.path.removeprefix(f"{model}/"), variable)
    for variable in step.optimizer.variables:
        role = "iteration" if variable.path.endswith("iteration") else "slot"
        found[id(variable.value.handle)] = (role, variable.path.replace(f"/{model}_", "/", 1), variable)
    for name, variable in step.schedule.variables.items():
        found[id(variable.value.handle)] = ("schedule", f"schedule/{name}", variable)
    return found


def program(function, arguments: tuple, step: CompiledStep, names: tuple[str, ...] = ()) -> tuple[bytes, Layout, dict]:
    """(the serialized HLO module, its layout, {parameter name: variable}) of `function` traced on
    `arguments`, whose variables are `step`'s.

    Args:
      function: a tf.function(jit_compile=True) of the batch (a dict of features) and other
        arguments, returning a dict or one tensor (named "output").
      arguments: (the batch, the other arguments...).
      step: the CompiledStep whose variables it reads and writes.
      names: the other arguments' names.

    Raises:
      InternalError: the module's parameters or outputs are not what the function says.
    """
    concrete = function.get_concrete_function(*arguments)
    serialized = function.experimental_get_compiler_ir(*arguments)(stage="hlo_serialized")
    module = hlo_pb2.HloModuleProto.FromString(serialized)
    shapes = module.host_program_shape.parameters
    aliases = {entry.parameter_number: entry.output_shape_index[0] for entry in module.input_output_alias.entries}
    batch = arguments[0]
    explicit = [("feature", name, batch[name]) for name in sorted(batch)]  # tf.nest's order
    explicit += [("argument", name, value) for name, value in zip(names, arguments[1:], strict=True)]
    known, variables, parameters = _variables(step), {}, []
    captured = []
    for tensor in concrete.captured_inputs:
        if tensor.dtype == tf.resource:
            role, name, variable = known[id(tensor)]
            variables[name] = variable
            captured.append((role, name, variable))
        else:
            captured.append(("constant", f"constant_{len(captured)}", tensor))
    if len(explicit) + len(captured) != len(shapes):
        raise InternalError(f"the module has {len(shapes)} parameters; the function {len(explicit)} arguments and "
                            f"{len(captured)} captures")
    for index, ((role, name, value), shape) in enumerate(zip(explicit + captured, shapes)):
        dtype = DTYPES[xla_data_pb2.PrimitiveType.Name(shape.element_type)]
        given = None
        if role in ("argument", "constant", "schedule"):
            given = np.asarray(value.numpy() if hasattr(value, "numpy") else value).tolist()
        parameters.append(Parameter(role, name, tuple(shape.dimensions), dtype,
                                    weight_init(name) if role == "weight" else None, given, aliases.get(index)))
    structure = concrete.structured_outputs
    returned = sorted(structure) if isinstance(structure, dict) else ["output"]
    written = {output: parameters[index].name for index, output in aliases.items()}
    result = module.host_program_shape.result
    outputs = len(result.tuple_shapes) if result.element_type == xla_data_pb2.TUPLE else 1
    if len(returned) + len(written) != outputs or sorted(written) != list(range(len(returned), outputs)):
        raise InternalError(f"the module has {outputs} outputs; the function returns {len(returned)} and writes "
                            f"{len(written)} variables")
    names = tuple(returned) + tuple(written[index] for index in sorted(written))
    return serialized, Layout(tuple(parameters), names), variables


def export_configuration(step: CompiledStep, features: dict[str, np.ndarray], slot_sequences: np.ndarray,
                         configuration: Configuration, directory: str, made_by: dict) -> None:
    """Writes one configuration of an export (bert_packed.update_program.export): its update
    program, its batch, and with configuration.checked the losses program and TensorFlow's
    outputs on this machine.

    Args:
      step: a CompiledStep of the configuration's model, precision and objective, accumulating
        nothing (--steps_per_update=1), under the default strategy.
      features: the micro-batch (the model's feature dict, NumPy).
      slot_sequences: int [rows, S], the sequence each slot holds (-1: none).
      configuration: what the manifest says of it (its files are filled in here).
      directory: the export.
      made_by: what made the export (the manifest keeps it).
    """
    batch = {name: tf.constant(value) for name, value in features.items()}
    arguments = (batch, step.update.dropout_seeds(0, 1))
    serialized, layout, variables = program(step.update.one_update, arguments, step, ("dropout_seeds",))
    contents = {"update.hlo.pb.xz": export.compress_program(serialized), "update.json": layout.to_json().encode(),
                "batch.npz": export.batch_bytes(features, slot_sequences)}
    if configuration.checked:
        losses_function = tf.function(lambda f: step.objective.slot_losses(step.model(f, training=False), f),
                                      jit_compile=True)
        losses_serialized, losses_layout, _ = program(losses_function, (batch,), step)
        contents["losses.hlo.pb.xz"] = export.compress_program(losses_serialized)
        contents["losses.json"] = losses_layout.to_json().encode()
        contents["reference.json"] = _reference(step, layout, variables, losses_function, arguments,
                                                configuration.seed).encode()
    export.write_configuration(directory, configuration, contents, made_by)


def _reference(step: CompiledStep, layout: Layout, variables: dict, losses_function, arguments: tuple,
               seed: int) -> str:
    """TensorFlow's own outputs from the drawn starting state: each slot's loss, then one update's
    outputs and the summary of every variable it writes (JSON)."""
    import json

    for parameter in layout.parameters:
        if parameter.name in variables and parameter.role in ("weight", "slot", "iteration"):
            variables[parameter.name].assign(export.draw(parameter, seed))
    slot_losses = losses_function(arguments[0]).numpy()
    outputs = {name: float(value) for name, value in step.update.one_update(*arguments).items()}
    state = {name: export.summary(name, variables[name].numpy()) for name in layout.outputs if name in variables}
    return json.dumps({"slot_losses": slot_losses.tolist(), "outputs": outputs, "state": state}) + "\n"
