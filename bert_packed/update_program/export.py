"""What an export of the update programs holds, written and read back (no TensorFlow, no JAX).

An export is a directory:

  manifest.json           format_version, what made it, and each configuration: its model, layout
                          (packed or padded), precision, rows, sequences, real tokens, model FLOPs
                          of one update, the memory plan's bytes, and its files with their sizes
                          and SHA-256 (written last, after the files it names)
  NAME/update.hlo.pb.xz   the whole update (forward, backward, clip, optimizer apply): HLO before
                          XLA's passes, xz-compressed
  NAME/update.json        its layout: every parameter (what it is, shape, dtype, how it starts,
                          the output that holds its new value) and every output's name
  NAME/batch.npz          the micro-batch (the model's features) and which sequence each slot holds
  NAME/losses.hlo.pb.xz   checked configurations: each slot's loss at the starting weights
  NAME/losses.json        (its layout)
  NAME/reference.json     checked configurations: TensorFlow's own outputs on the CPU

Starting weights are not carried (the `mini` model's alone are 44 MB): both sides draw them from
the export's seed with `draw`, kernels and embeddings normal(0, 0.02), LayerNorm scales 1,
biases and offsets 0, each tensor from its own stream (the seed and its name), so a tensor's
values do not depend on which others a program reads. Updated weights and slots are compared by
`summary`: the norm, the sum, the sum of magnitudes and a fixed sample of elements of each tensor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import lzma
import os
import zlib

import numpy as np

from bert_packed.errors import UserError
from bert_packed.storage import files

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# Elements of each tensor a reference keeps (chosen by the tensor's name, the same on both sides).
SAMPLE_SIZE = 16
# How each kind of parameter starts (weights by their init; the rest are given or zero).
ROLES = ("feature", "argument", "constant", "weight", "slot", "iteration", "schedule")
WEIGHT_INITS = ("normal", "ones", "zeros")
NORMAL_STDDEV = 0.02


class ExportError(UserError, ValueError):
    """An export that is missing, partial, or does not describe its programs."""


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One parameter of a program, in the program's order.

    Attributes:
      role: one of ROLES: a feature of the batch, an argument or captured constant (its value
        given), a weight (drawn by `init`), an optimizer slot or iteration count (zeros), a
        schedule value (given).
      name: the feature's key, or the variable's path.
      shape, dtype: as the program takes it (dtype a NumPy name).
      init: a weight's start: normal, ones or zeros.
      value: an argument's, constant's or schedule value's value.
      output: the output that holds its value after the call (its buffer donated to it), or None.
    """

    role: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    init: str | None = None
    value: object = None
    output: int | None = None


@dataclasses.dataclass(frozen=True)
class Layout:
    """A program's parameters and outputs.

    Attributes:
      parameters: in the program's order.
      outputs: each output's name, in the program's order (a parameter's new value is named as it).
    """

    parameters: tuple[Parameter, ...]
    outputs: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({"parameters": [dataclasses.asdict(p) for p in self.parameters], "outputs": self.outputs},
                          indent=0) + "\n"

    @classmethod
    def from_json(cls, text: str, path: str) -> Layout:
        try:
            given = json.loads(text)
            parameters = tuple(Parameter(**{**entry, "shape": tuple(entry["shape"])}) for entry in given["parameters"])
            outputs = tuple(given["outputs"])
        except (ValueError, TypeError, KeyError) as e:
            raise ExportError(f"{path}: not a program's layout ({type(e).__name__}: {e})") from None
        bad = [p.name for p in parameters if p.role not in ROLES or (p.role == "weight" and p.init not in WEIGHT_INITS)]
        if bad:
            raise ExportError(f"{path}: parameter {bad[0]!r} has no known role or start")
        return cls(parameters, outputs)

    def state(self) -> list[tuple[int, Parameter]]:
        """(index, parameter) of those whose new value an output holds (weights, slots, iteration)."""
        return [(index, p) for index, p in enumerate(self.parameters) if p.output is not None]


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One configuration of an export (an entry of manifest.json).

    Attributes:
      name: its key, and its folder.
      model: tiny, mini, base or large; bert: its BERT config (google-research's keys).
      objective: pretraining or classification.
      layout: packed or padded (one sequence a row).
      precision: fp32 or bf16 (mixed: float32 weights, bf16 products).
      fp32_products: "highest" (TensorFloat-32 off when exported) or "tf32" (TensorFlow's default).
      max_seq_length: L; rows: rows of the micro-batch.
      sequences, real_tokens, predictions: what the micro-batch holds.
      flops: model FLOPs of one update (docs/benchmarks.md's count: real tokens only).
      planned_bytes: the memory plan's bytes for a replica of this step (None: unplanned).
      sized_for: the card whose memory sized the micro-batch ("80 GB"), or None.
      checked: TensorFlow's outputs are carried (reference.json, the losses program).
      partner: the configuration of the same sequences in the other layout.
      seed: the starting weights' seed.
      files: {file name: {"bytes", "sha256"}}.
    """

    name: str
    model: str
    bert: dict
    objective: str
    layout: str
    precision: str
    fp32_products: str
    max_seq_length: int
    rows: int
    sequences: int
    real_tokens: int
    predictions: int
    flops: float
    planned_bytes: int | None
    sized_for: str | None
    checked: bool
    partner: str | None
    seed: int
    files: dict = dataclasses.field(default_factory=dict)


def compress_program(serialized: bytes) -> bytes:
    return lzma.compress(serialized, preset=6)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def read_manifest(directory: str, drop_broken: bool = False) -> tuple[dict, dict[str, Configuration]]:
    """(what made the export, {name: Configuration}) of the export in `directory`.

    Args:
      directory: the export.
      drop_broken: leave out a configuration the manifest does not describe as the exporter
        writes it (the exporter then writes it again), instead of refusing the manifest.

    Raises:
      ExportError: no manifest, not one of this format, or (unless drop_broken) a configuration
        not described as the exporter writes it.
    """
    path = os.path.join(directory, MANIFEST)
    if not files.exists(path):
        raise ExportError(f"{directory}: no {MANIFEST}; expected what scripts/export_update_programs.py writes")
    try:
        given = files.read_json_object(path)
    except ValueError as e:
        raise ExportError(f"{path}: {e}") from None
    if given.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{path}: format_version {given.get('format_version')!r}, expected {FORMAT_VERSION}")
    if not isinstance(given.get("made_by", {}), dict) or not isinstance(given.get("configurations"), dict):
        raise ExportError(f"{path}: made_by or configurations is not an object")
    configurations = {}
    for name, entry in given["configurations"].items():
        try:
            try:
                configurations[name] = Configuration(**entry)
            except TypeError as e:
                raise ExportError(f"{path}: {name} is not described as the exporter writes it ({e})") from None
            _check_described(configurations[name], name, path)
        except ExportError:
            configurations.pop(name, None)
            if not drop_broken:
                raise
    return given.get("made_by", {}), configurations


# What each field of a configuration is (a manifest edited by hand is refused, not half read).
FIELD_TYPES = {"name": str, "model": str, "bert": dict, "objective": str, "layout": str, "precision": str,
               "fp32_products": str, "max_seq_length": int, "rows": int, "sequences": int, "real_tokens": int,
               "predictions": int, "flops": (int, float), "planned_bytes": (int, type(None)),
               "sized_for": (str, type(None)), "checked": bool, "partner": (str, type(None)), "seed": int,
               "files": dict}
FIELD_VALUES = {"objective": ("pretraining", "classification"), "layout": ("packed", "padded"),
                "precision": ("fp32", "bf16"), "fp32_products": ("highest", "tf32")}


def _check_described(configuration: Configuration, key: str, path: str) -> None:
    """Raises ExportError naming the configuration and the field that is not what the exporter writes."""
    for field, kind in FIELD_TYPES.items():
        value = getattr(configuration, field)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int, float))):
            raise ExportError(f"{path}: {key}'s {field} is {value!r}, not what the exporter writes")
        if field in FIELD_VALUES and value not in FIELD_VALUES[field]:
            raise ExportError(f"{path}: {key}'s {field} is {value!r}; expected one of {', '.join(FIELD_VALUES[field])}")
    if configuration.name != key or min(configuration.rows, configuration.sequences, configuration.seed) < 0 \
            or configuration.rows == 0:
        raise ExportError(f"{path}: {key} is described as {configuration.name!r} with {configuration.rows} rows: "
                          f"not what the exporter writes")
    for name, recorded in configuration.files.items():
        if not (isinstance(recorded, dict) and isinstance(recorded.get("bytes"), int)
                and isinstance(recorded.get("sha256"), str)):
            raise ExportError(f"{path}: {key}'s file {name!r} is recorded as {recorded!r}; expected its bytes and sha256")
    missing = sorted(set(expected_files(configuration)) - set(configuration.files))
    if missing:
        raise ExportError(f"{path}: {key} lists no {missing[0]}; export the configuration again")


def expected_files(configuration: Configuration) -> tuple[str, ...]:
    """The files a configuration of its kind has."""
    checked = ("losses.hlo.pb.xz", "losses.json", "reference.json") if configuration.checked else ()
    return ("update.hlo.pb.xz", "update.json", "batch.npz", *checked)


def write_configuration(directory: str, configuration: Configuration, contents: dict[str, bytes],
                        made_by: dict) -> None:
    """Writes a configuration's files (each under a temporary name, then renamed), then the
    manifest with it: a configuration is in the export only once all its files are."""
    files.makedirs(os.path.join(directory, configuration.name))
    described = {}
    for name, data in contents.items():
        with files.atomic_open(os.path.join(directory, configuration.name, name), "wb") as f:
            f.write(data)
        described[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    configurations = read_manifest(directory, True)[1] if files.exists(os.path.join(directory, MANIFEST)) else {}
    configurations[configuration.name] = dataclasses.replace(configuration, files=described)
    manifest = {"format_version": FORMAT_VERSION, "made_by": made_by,
                "configurations": {name: dataclasses.asdict(c) for name, c in sorted(configurations.items())}}
    files.write_text_atomically(os.path.join(directory, MANIFEST), json.dumps(manifest, indent=1) + "\n")


def read_file(directory: str, configuration: Configuration, name: str) -> bytes:
    """A configuration's file, checked against the manifest (its size and SHA-256).

    Raises:
      ExportError: the file is not there, not listed, or not what the manifest recorded.
    """
    path = os.path.join(directory, configuration.name, name)
    recorded = configuration.files.get(name)
    if recorded is None:
        raise ExportError(f"{path}: not in the manifest's files of {configuration.name}")
    if not files.exists(path):
        raise ExportError(f"{path}: missing (the manifest lists it); export the configuration again")
    with files.open_file(path, "rb") as f:
        data = f.read()
    if len(data) != recorded["bytes"] or hashlib.sha256(data).hexdigest() != recorded["sha256"]:
        raise ExportError(f"{path}: {len(data):,} bytes, not the {recorded['bytes']:,} (and SHA-256) the manifest "
                          f"recorded: partial or changed; export the configuration again")
    return data


def read_program(directory: str, configuration: Configuration, name: str) -> tuple[bytes, Layout]:
    """(the serialized HLO, its layout) of a configuration's program `name` ("update" or "losses")."""
    data = read_file(directory, configuration, f"{name}.hlo.pb.xz")
    try:
        serialized = lzma.decompress(data)
    except lzma.LZMAError as e:
        raise ExportError(f"{os.path.join(directory, configuration.name, name)}.hlo.pb.xz: not xz ({e})") from None
    layout_name = f"{name}.json"
    layout = Layout.from_json(read_file(directory, configuration, layout_name).decode("utf-8"),
                              os.path.join(directory, configuration.name, layout_name))
    return serialized, layout


def read_batch(directory: str, configuration: Configuration) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(the micro-batch's features, the sequence each slot holds [rows, S], -1 for none)."""
    path = os.path.join(directory, configuration.name, "batch.npz")
    data = read_file(directory, configuration, "batch.npz")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            features = {name.removeprefix("feature:"): arrays[name] for name in arrays.files
                        if name.startswith("feature:")}
            slot_sequences = arrays["slot_sequences"]
    except (ValueError, OSError, KeyError, EOFError) as e:
        raise ExportError(f"{path}: not a micro-batch of the exporter's ({type(e).__name__}: {e})") from None
    if slot_sequences.ndim != 2 or len(slot_sequences) != configuration.rows:
        raise ExportError(f"{path}: slot_sequences is {list(slot_sequences.shape)}, expected {configuration.rows} rows")
    return features, slot_sequences


def check_batch(features: dict[str, np.ndarray], layout: Layout, path: str) -> None:
    """Raises ExportError naming `path` unless the batch holds every feature the program takes,
    of its shape and dtype."""
    for parameter in layout.parameters:
        if parameter.role != "feature":
            continue
        value = features.get(parameter.name)
        if value is None:
            raise ExportError(f"{path}: no feature {parameter.name!r}, which the program takes")
        if tuple(value.shape) != parameter.shape or value.dtype.name != parameter.dtype:
            raise ExportError(f"{path}: {parameter.name} is {value.dtype.name}{list(value.shape)}, the program takes "
                              f"{parameter.dtype}{list(parameter.shape)}")


def batch_bytes(features: dict[str, np.ndarray], slot_sequences: np.ndarray) -> bytes:
    return npz_bytes({**{f"feature:{name}": value for name, value in features.items()},
                      "slot_sequences": slot_sequences})


def read_reference(directory: str, configuration: Configuration) -> dict:
    """TensorFlow's outputs of a checked configuration: {"slot_losses", "outputs", "state"}."""
    path = os.path.join(directory, configuration.name, "reference.json")
    data = read_file(directory, configuration, "reference.json")
    try:
        reference = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExportError(f"{path}: not JSON ({e})") from None
    if not (isinstance(reference, dict) and isinstance(reference.get("slot_losses"), list)
            and isinstance(reference.get("outputs"), dict) and reference["outputs"]
            and isinstance(reference.get("state"), dict) and reference["state"]):
        raise ExportError(f"{path}: not TensorFlow's outputs as the exporter writes them (slot_losses, outputs and "
                          f"state, none empty)")
    return reference


def draw(parameter: Parameter, seed: int) -> np.ndarray:
    """A parameter's starting value, the same wherever it is drawn.

    >>> weight = Parameter("weight", "layer_0/output/kernel", (2, 3), "float32", "normal")
    >>> bool((draw(weight, 1) == draw(weight, 1)).all()), draw(weight, 1).dtype.name
    (True, 'float32')
    """
    shape, dtype = parameter.shape, np.dtype(parameter.dtype)
    if parameter.role in ("feature",):
        raise ValueError(f"{parameter.name}: a feature comes from the batch, not drawn")
    if parameter.role in ("argument", "constant", "schedule"):
        return np.asarray(parameter.value, dtype).reshape(shape)
    if parameter.role == "weight" and parameter.init == "normal":
        stream = np.random.default_rng([seed, zlib.crc32(parameter.name.encode())])
        return (stream.standard_normal(shape, dtype=np.float32) * NORMAL_STDDEV).astype(dtype)
    if parameter.role == "weight" and parameter.init == "ones":
        return np.ones(shape, dtype)
    return np.zeros(shape, dtype)


def initial_values(layout: Layout, features: dict[str, np.ndarray], seed: int) -> list[np.ndarray]:
    """Every parameter's value for a program's first call: the batch's features, the rest drawn."""
    values = []
    for parameter in layout.parameters:
        value = features[parameter.name] if parameter.role == "feature" else draw(parameter, seed)
        values.append(np.asarray(value, np.dtype(parameter.dtype)))
    return values


def sample_indices(name: str, size: int) -> np.ndarray:
    """The fixed elements of a tensor a summary keeps (chosen by its name)."""
    stream = np.random.default_rng(zlib.crc32(name.encode()))
    return np.sort(stream.choice(size, min(SAMPLE_SIZE, size), replace=False))


def summary(name: str, value) -> dict:
    """What is compared of a tensor: its norm, sum, sum of magnitudes (float64) and a sample."""
    flat = np.asarray(value, np.float64).reshape(-1)
    return {"norm": float(np.linalg.norm(flat)), "sum": float(flat.sum()), "abs_sum": float(np.abs(flat).sum()),
            "sample": flat[sample_indices(name, flat.size)].tolist()}


def summary_difference(got: dict, want: dict, size: int) -> tuple[float, float]:
    """How far apart two summaries of one tensor are, relative to the tensor's scale:
    (the norm's difference over the norm, or the sum's over the sum of magnitudes, the larger;
    the largest sampled element's over the tensor's root mean square). (0, 0) for zero tensors."""
    if want["norm"] == 0 and got["norm"] == 0:
        return 0.0, 0.0
    norm = max(abs(want["norm"]), 1e-30)
    whole = max(abs(got["norm"] - want["norm"]) / norm, abs(got["sum"] - want["sum"]) / max(want["abs_sum"], 1e-30))
    elements = max((abs(a - b) for a, b in zip(got["sample"], want["sample"])), default=0.0)
    return float(whole), float(elements / max(norm / np.sqrt(max(size, 1)), 1e-30))


def sequence_losses(slot_losses: np.ndarray, slot_sequences: np.ndarray) -> dict[int, float]:
    """{sequence: its loss} from each slot's loss and the sequence each slot holds.

    >>> sequence_losses(np.array([[1.5, 2.0], [3.0, 0.0]]), np.array([[4, 0], [1, -1]]))
    {4: 1.5, 0: 2.0, 1: 3.0}
    """
    held = slot_sequences >= 0
    return {int(s): float(v) for s, v in zip(slot_sequences[held], np.asarray(slot_losses)[held])}
