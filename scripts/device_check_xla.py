"""TensorFlow's update programs on an accelerator without TensorFlow: checked, timed, held against a peer.

    python scripts/export_update_programs.py --output_dir=.device_export     # where TensorFlow is
    python scripts/device_check_xla.py --export_dir=.device_export --output_json=xla.json   # on the GPU

It needs JAX (with the accelerator's plugin), NumPy, absl-py and this checkout (PyTorch and
transformers for the peer), not TensorFlow. Every figure is of "TensorFlow 2.21's update program,
compiled and run by JAX's XLA": TensorFlow's runtime and input pipeline are not in it.

On an accelerator, every configuration's update is first compiled in --workers processes at once,
with XLA's autotuning on (its results cached in --cache_dir, an ignored folder of the checkout, so
that a second call on the same machine skips it). Then each configuration runs in a process of its
own, one after another, alone on the device (bert_packed.update_program.run.measure):
1. compiles the update again (from the cache) and checks that its parameters and in-place outputs
   are its layout's;
2. checked configurations (mini, tiny): each sequence's loss at the starting weights and one
   update from the starting state, against TensorFlow's outputs on the CPU (run.TOLERANCES says
   what is compared, within what, and why);
3. draws the weights on the device, runs --warmup calls and times --calls calls, each call's
   written state the next call's (donated buffers);
4. reads the compiled program's bytes and the device's peak, against the memory plan's.
Then: packed against padded, each sequence's loss on the device (checked pairs) and the speed-up
in real tokens/s against the packing factor (timed pairs); the peer, Hugging Face transformers'
BertForPreTraining on the same padded sequences at the largest padded BERT-Large configuration's
shape (bf16 autocast, its default attention, AdamW), in a process of its own; the card's clocks
and power before and after. One table on stdout, every figure in --output_json (written after each
configuration: a call stopped at its time limit keeps what it measured). A configuration that
cannot run (its files, a device too small) is a line of the table, and the rest goes on. Exit
status 1 when a check fails or a configuration could not run.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import time

from absl import flags

from bert_packed.cli.common import run
from bert_packed.errors import SettingsError
from bert_packed.storage.files import write_text_atomically
from bert_packed.training import cards
from bert_packed.update_program import export

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PROGRAM = "device_check_xla"
FLAGS = flags.FlagValues()
flags.DEFINE_string("export_dir", None, "What scripts/export_update_programs.py wrote.", flag_values=FLAGS)
flags.DEFINE_string("output_json", None, "Where every figure goes.", flag_values=FLAGS)
flags.DEFINE_list("configurations", [], "Which to run (default: all; on a CPU, the checked ones).", flag_values=FLAGS)
flags.DEFINE_integer("workers", 4, "Processes compiling at once on an accelerator (autotuning, before any runs).",
                     lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("warmup", 3, "Untimed calls of each configuration.", lower_bound=0, flag_values=FLAGS)
flags.DEFINE_integer("calls", 20, "Timed calls of each configuration.", lower_bound=1, flag_values=FLAGS)
flags.DEFINE_integer("seconds", 420, "Configurations still waiting after this many seconds are not started.",
                     lower_bound=1, flag_values=FLAGS)
flags.DEFINE_bool("peer", True, "Also time transformers' BertForPreTraining (needs PyTorch and transformers).", flag_values=FLAGS)
flags.DEFINE_float("peak_tflops", None, "The device's bf16 dense peak for MFU (default: the named card's).",
                   lower_bound=0.001, flag_values=FLAGS)
flags.DEFINE_string("cache_dir", os.path.join(ROOT, ".cache", "xla_autotune"), "XLA's autotuning results, kept.",
                    flag_values=FLAGS)
flags.mark_flags_as_required(["export_dir"], flag_values=FLAGS)


def card_readings() -> dict:
    """The card's clocks, power and temperature now (nvidia-smi, read only); {} without it."""
    query = "name,clocks.sm,clocks.mem,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active"
    try:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=True).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    return dict(zip(query.split(","), (value.strip() for value in line.split(","))))


def autotune_flags(cache_dir: str) -> str:
    """XLA_FLAGS with the autotuning cache, if this XLA knows the flag (an unknown one ends XLA's
    process: tried in a process of its own first)."""
    flag = f"--xla_gpu_per_fusion_autotune_cache_dir={cache_dir}"
    trial = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, timeout=300,
                           env={**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flag}"})
    if trial.returncode:
        print(f"{PROGRAM}: this XLA takes no autotuning cache ({flag}): every call tunes again", flush=True)
        return os.environ.get("XLA_FLAGS", "")
    os.makedirs(cache_dir, exist_ok=True)
    return f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def chosen(configurations: dict, on_accelerator: bool) -> list[str]:
    """The configurations to run, in the order they start: the largest timed pair first (the
    headline, and the longest compiles), then the checked ones (quick), then the rest, largest
    first."""
    names = FLAGS.configurations or [name for name, c in configurations.items() if on_accelerator or c.checked]
    unknown = [name for name in names if name not in configurations]
    if unknown:
        raise SettingsError(f"--configurations: {unknown[0]!r} is not in {FLAGS.export_dir}'s manifest "
                            f"({', '.join(configurations)})")
    if not names:
        raise SettingsError(f"{FLAGS.export_dir}: no configuration to run" + (
            "" if on_accelerator else " on a CPU (only those TensorFlow's outputs are kept for run there without "
                                      "--configurations)"))
    largest = max(names, key=lambda name: configurations[name].flops)
    headline = {largest, configurations[largest].partner}
    return sorted(names, key=lambda name: (name not in headline, not configurations[name].checked,
                                           -configurations[name].flops))


def too_large(configuration, limit: int | None) -> str | None:
    """Why the device cannot hold a configuration by the memory plan (None: it may)."""
    if limit is None or configuration.planned_bytes is None or configuration.planned_bytes <= limit:
        return None
    sized = f", sized for a {configuration.sized_for} card" if configuration.sized_for else ""
    return (f"the plan needs {configuration.planned_bytes / 2**30:.1f} GiB{sized}; the device holds "
            f"{limit / 2**30:.1f} GiB")


def measure_all(names: list[str], configurations: dict, limit: int | None, on_accelerator: bool):
    """(name, run.measure's figures) of each configuration as it ends. On an accelerator, first
    every update is compiled in --workers processes at once (XLA's autotuning fills its cache);
    then each configuration runs in a process of its own, one after another, alone on the device
    (it compiles again from the cache). Those the device cannot hold are not started, nor those
    still waiting when --seconds have passed."""
    from bert_packed.update_program import run as runner

    started = time.perf_counter()
    for name in names:
        if too_large(configurations[name], limit):
            yield name, {"name": name, "error": too_large(configurations[name], limit)}
    names = [name for name in names if not too_large(configurations[name], limit)]
    context = multiprocessing.get_context("spawn")
    compiled = {}
    if on_accelerator and names:
        with concurrent.futures.ProcessPoolExecutor(min(FLAGS.workers, len(names)), mp_context=context,
                                                    initializer=runner.worker_start, max_tasks_per_child=1) as pool:
            for name, figures in zip(names, pool.map(runner.compile_only, [FLAGS.export_dir] * len(names), names)):
                compiled[name] = figures
                print(f"{name}: " + (figures["error"] if "error" in figures else
                                     f"compiled in {figures['compile_seconds']:.0f} s"), flush=True)
    for name in [name for name in names if "error" in compiled.get(name, {})]:
        yield name, {"name": name, **compiled[name]}
    names = [name for name in names if "error" not in compiled.get(name, {})]
    if not names:
        return
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context, initializer=runner.worker_start,
                                                max_tasks_per_child=1) as pool:
        futures = {pool.submit(runner.measure, FLAGS.export_dir, name, FLAGS.warmup, FLAGS.calls): name
                   for name in names}
        for done in concurrent.futures.as_completed(futures):
            name = futures[done]
            try:
                figures = done.result()
            except concurrent.futures.CancelledError:
                figures = {"name": name, "error": f"not started: --seconds={FLAGS.seconds} had passed"}
            except concurrent.futures.process.BrokenProcessPool as e:  # a worker killed (out of memory, say)
                figures = {"name": name, "error": f"its worker process died ({e})"}
            if name in compiled and "compile_seconds" in compiled[name]:
                figures["autotuned_compile_seconds"] = compiled[name]["compile_seconds"]
            if time.perf_counter() - started > FLAGS.seconds:
                for future in futures:
                    future.cancel()  # those not started yet
            yield name, figures


def rates(configuration, figures: dict, peak: float | None) -> dict:
    """sequences/s, real tokens/s, model TFLOP/s and MFU of a timed configuration."""
    seconds = figures["time"]["median_seconds"]
    flops = configuration.flops / seconds
    return {"sequences_per_second": configuration.sequences / seconds,
            "real_tokens_per_second": configuration.real_tokens / seconds, "model_tflops": flops / 1e12,
            "mfu": flops / 1e12 / peak if peak else None,
            "spread": [min(figures["time"]["seconds"]), max(figures["time"]["seconds"])]}


def pairs(configurations: dict, results: dict) -> dict:
    """Packed against padded, for each pair both measured: each sequence's loss (checked pairs),
    and the real-tokens and sequences speed-ups against the packing factor."""
    from bert_packed.update_program.run import PACKED_TOLERANCES, relative

    compared = {}
    for name, configuration in configurations.items():
        padded = configuration.partner
        if configuration.layout != "packed" or name not in results or padded not in results:
            continue
        packed_figures, padded_figures = results[name], results[padded]
        if "error" in packed_figures or "error" in padded_figures:
            continue
        pair = {"packing_factor": configuration.sequences / configuration.rows}
        if "rates" in packed_figures and "rates" in padded_figures:
            for key in ("real_tokens_per_second", "sequences_per_second"):
                pair[f"speedup_{key}"] = packed_figures["rates"][key] / padded_figures["rates"][key]
        if "check" in packed_figures and "check" in padded_figures:
            a, b = packed_figures["check"]["sequence_losses"], padded_figures["check"]["sequence_losses"]
            common = sorted(set(a) & set(b))
            pair["sequence_losses"] = relative([a[s] for s in common], [b[s] for s in common]) if common else None
            pair["sequences_compared"] = len(common)
            pair["tolerance"] = PACKED_TOLERANCES[configuration.precision]
            pair["passed"] = pair["sequence_losses"] is not None and pair["sequence_losses"] <= pair["tolerance"]
        compared[name] = pair
    return compared


def time_the_peer(configurations: dict, results: dict, on_accelerator: bool) -> dict:
    """The peer on the largest padded pre-training configuration measured, in a process of its own."""
    padded = [name for name, c in configurations.items() if c.layout == "padded" and c.objective == "pretraining"
              and "time" in results.get(name, {})]
    if not padded:
        return {"error": "no padded pre-training configuration was timed"}
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return {"error": "needs PyTorch and transformers"}
    name = max(padded, key=lambda n: configurations[n].flops)
    configuration = configurations[name]
    features, _ = export.read_batch(FLAGS.export_dir, configuration)
    from bert_packed.update_program.peer import time_peer

    context = multiprocessing.get_context("spawn")
    rows = len(features["input_ids"])
    while True:  # a peer that runs out of the device's memory tries half the rows
        batch = {key: value[:rows] for key, value in features.items()}
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            try:
                figures = pool.submit(time_peer, configuration.bert, batch, FLAGS.warmup, FLAGS.calls,
                                      on_accelerator and configuration.precision == "bf16").result()
                break
            except Exception as e:  # noqa: BLE001 - a peer that does not fit or fails is reported, not fatal
                error = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        if "out of memory" not in error.lower() or rows == 1:
            return {"configuration": name, "error": error}
        rows //= 2
    ours = results[name]["rates"]["sequences_per_second"]
    packed = results.get(configuration.partner, {}).get("rates", {}).get("sequences_per_second")
    return {**figures, "configuration": name, "of_rows": len(features["input_ids"]),
            "ours_padded_over_peer": ours / figures["sequences_per_second"],
            "ours_packed_over_peer": packed / figures["sequences_per_second"] if packed else None}


def main(argv) -> int:
    del argv
    if importlib.util.find_spec("jax") is None:
        raise SettingsError("needs JAX (on an NVIDIA GPU: pip install 'jax[cuda13]' or 'jax[cuda12]', as the driver "
                            "allows)")
    made_by, configurations = export.read_manifest(FLAGS.export_dir)
    # Each process takes what its program needs, up to nearly all of the device (JAX's default share
    # is 75%: BERT-Large's micro-batch as the plan sizes it needs more).
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    os.environ["XLA_FLAGS"] = autotune_flags(FLAGS.cache_dir)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)  # "Unable to initialize backend 'tpu'"
    import jax

    device = jax.devices()[0]
    on_accelerator = device.platform != "cpu"
    name = device.device_kind if on_accelerator else "CPU"
    peak = FLAGS.peak_tflops or cards.bf16_peak_tflops(name)
    if not on_accelerator:
        print(f"{PROGRAM}: no accelerator: JAX sees only the CPU; the checked configurations run there", flush=True)
    names = chosen(configurations, on_accelerator)
    report = {"device": name, "jax": jax.__version__, "peak_tflops": peak, "export": made_by,
              "made_how": f"TensorFlow {made_by.get('tensorflow')}'s update program, compiled and run by JAX "
                          f"{jax.__version__}'s XLA on {name}; TensorFlow's runtime and input pipeline not included",
              "card_before": card_readings(), "configurations": {}, "skipped": sorted(set(configurations) - set(names))}
    write(report)
    started = time.perf_counter()
    limit = (device.memory_stats() or {}).get("bytes_limit") if on_accelerator else None
    for key, figures in measure_all(names, configurations, limit, on_accelerator):
        if "time" in figures:
            figures["rates"] = rates(configurations[key], figures, peak)
        report["configurations"][key] = figures
        print(f"{key}: " + (figures["error"] if "error" in figures else
                            f"{figures['time']['median_seconds'] * 1000:.1f} ms a call"), flush=True)
        write(report)
    report["pairs"] = pairs(configurations, report["configurations"])
    report["peer"] = time_the_peer(configurations, report["configurations"], on_accelerator) if FLAGS.peer else {}
    report["card_after"] = card_readings()
    report["seconds"] = time.perf_counter() - started
    report["failed"] = failed_checks(report)
    report["not_run"] = sorted(name for name, figures in report["configurations"].items() if "error" in figures)
    write(report)
    print_table(report, configurations)
    return 1 if report["failed"] or report["not_run"] else 0


def failed_checks(report: dict) -> list[str]:
    failed = [f"{name}: against TensorFlow" for name, figures in report["configurations"].items()
              if not figures.get("check", {}).get("passed", True)]
    failed += [f"{name}: packed against padded" for name, pair in report["pairs"].items() if pair.get("passed") is False]
    return failed


def write(report: dict) -> None:
    if FLAGS.output_json:
        write_text_atomically(FLAGS.output_json, json.dumps(report, indent=1, default=float) + "\n")


def gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.2f}"


def print_table(report: dict, configurations: dict) -> None:
    print(f"\n{report['made_how']}\n")
    print("| configuration | rows | sequences | ms a call (median, range) | sequences/s | real tokens/s | MFU | GiB: "
          "compiled / peak / plan | against TensorFlow |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, figures in sorted(report["configurations"].items()):
        c = configurations[name]
        if "error" in figures:
            print(f"| {name} | {c.rows} | {c.sequences} | not run: {figures['error']} |  |  |  |  |  |")
            continue
        r, m = figures["rates"], figures["memory"]
        check = figures.get("check")
        verdict = (f"losses {check['slot_losses']:.1e}, outputs {check['outputs']:.1e}, state {check['state']:.1e}, "
                   f"elements {check['elements']:.1e} "
                   f"({'passed' if check['passed'] else 'FAILED'})") if check else "-"
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        print(f"| {name} | {c.rows} | {c.sequences} | {figures['time']['median_seconds'] * 1000:.1f} "
              f"({r['spread'][0] * 1000:.1f}-{r['spread'][1] * 1000:.1f}) | {r['sequences_per_second']:,.1f} | "
              f"{r['real_tokens_per_second']:,.0f} | {mfu} | {gib(m['compiled'])} / {gib(m['peak'])} / "
              f"{gib(c.planned_bytes)} | {verdict} |")
    for name, pair in report["pairs"].items():
        parts = []
        if "speedup_real_tokens_per_second" in pair:
            parts.append(f"real tokens/s {pair['speedup_real_tokens_per_second']:.2f}x (sequences/s "
                         f"{pair['speedup_sequences_per_second']:.2f}x) at packing factor {pair['packing_factor']:.2f}")
        if pair.get("sequence_losses") is not None:
            parts.append(f"each sequence's loss within {pair['sequence_losses']:.1e} of padded over "
                         f"{pair['sequences_compared']} sequences (at most {pair['tolerance']:g}: "
                         f"{'passed' if pair['passed'] else 'FAILED'})")
        print(f"\npacked against padded, {name}: " + "; ".join(parts))
    peer = report["peer"]
    if peer:
        print("\npeer: " + ((f"{peer['configuration']}: " if "configuration" in peer else "") + peer["error"]
                             if "error" in peer else
                             f"transformers' BertForPreTraining ({peer['attention']} attention, AdamW, "
                             f"{'bf16 autocast' if peer['bf16'] else 'fp32'}) on {peer['rows']} of "
                             f"{peer['configuration']}'s {peer['of_rows']} rows: {peer['sequences_per_second']:,.1f} "
                             f"sequences/s; ours padded "
                             f"{peer['ours_padded_over_peer']:.2f}x" + (
                                 f", packed {peer['ours_packed_over_peer']:.2f}x" if peer["ours_packed_over_peer"]
                                 else "") + " its sequences/s"))
    for when in ("before", "after"):
        readings = report[f"card_{when}"]
        if readings:
            print(f"card {when}: " + ", ".join(f"{k} {v}" for k, v in readings.items()))
    ending = [f"{len(report['failed'])} check(s) failed: {'; '.join(report['failed'])}"] if report["failed"] else []
    if report["not_run"]:
        ending.append(f"{len(report['not_run'])} configuration(s) not run: {', '.join(report['not_run'])}")
    print(f"\n{PROGRAM}: " + ("; ".join(ending) if ending else f"every check passed ({report['seconds']:.0f} s)"))


def entry_point():
    run(main, PROGRAM, "output_json", "What was measured is in --output_json", flag_values=FLAGS)


if __name__ == "__main__":
    entry_point()
