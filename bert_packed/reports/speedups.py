"""Speed-ups measured alternately (bert_packed.training.throughput's rounds, packed against its
baseline in one process): their median and range, what packing promises them (the packing
factor, or for real tokens/s the real-token ratio of the rows each mode timed), and the line
that says both, shared by the benchmarks and compare_curves.
"""

from __future__ import annotations

import statistics

# A speed-up above what packing promises, said so and why.
ABOVE_THE_FACTOR = "above the packing factor"
ABOVE_THE_FACTOR_WHY = ("more than packing saves: on a CPU fewer rows may fit its caches better and share an "
                        "update's fixed cost; a round's clock is noisy")



def summary(values: list[float]) -> dict:
    """Median and range of per-round figures."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def median_and_range(values: list[float], spec: str = ".2f") -> str:
    """Per-round figures as "median (min-max)", e.g. "1.19 (0.99-1.30)"."""
    s = summary(values)
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


# What a speed-up in real tokens/s is held to: the ratio of the real tokens a row each mode timed
# (promised_token_speedup).
TOKENS_PROMISE = "real-token ratio"
TOKENS_PROMISE_WHY = ("speed-ups in real tokens/s, held to the real-token ratio: the real tokens a row of the batches "
                      "each mode timed (the packing factor where both read sequences of the same lengths; their "
                      "rounds read others, so sequences/s can mislead)")


def promised_token_speedup(result: dict, name: str) -> float:
    """The speed-up in real tokens/s that packing promises `name` over the baseline of a
    measure_alternately result (bert_packed.training.throughput): the ratio of the real tokens a
    row each timed (the median of its rounds' padding efficiencies). It is the packing factor
    where both timed sequences of the same lengths; where their rounds read others (the padded
    side's longer, say), the measured ratio is held to it, not to the packing factor.

    >>> promised_token_speedup({"baseline": "padded", "modes": {
    ...     "packed": {"padding_efficiency": [0.98, 0.99, 1.0]}, "padded": {"padding_efficiency": [0.5, 0.4, 0.6]}}},
    ...     "packed")
    1.98
    """
    efficiency = {mode: summary(figures["padding_efficiency"])["median"] for mode, figures in result["modes"].items()}
    return efficiency[name] / efficiency[baseline_of(result)]


def baseline_of(result: dict) -> str:
    """The mode a measure_alternately result's speed-ups are against: the one it names, or in a
    file written before it named one, the mode whose every round's speed-up is exactly 1 (a JSON
    file may hold the modes in any order).

    Raises:
      ValueError: no such mode.
    """
    if "baseline" in result:
        if result["baseline"] not in result["modes"]:
            raise ValueError(f"its baseline {result['baseline']!r} is none of its modes")
        return result["baseline"]
    ones = [mode for mode, speedups in result["token_speedups"].items() if speedups and set(speedups) == {1.0}]
    if len(ones) != 1:
        raise ValueError(f"no one mode its speed-ups are against ({len(ones)} at 1.0 every round)")
    return ones[0]


def describe_speedup(speedups: list[float], promised: float, promise: str = "packing factor") -> str:
    """One line: the median speed-up, its range, its share of what packing promises (`promised`,
    named `promise`: the packing factor, or for real tokens/s TOKENS_PROMISE), and
    a caveat when the rounds disagree by more than the effect itself, or when the speed-up is
    above the promise (ABOVE_THE_FACTOR_WHY).

    >>> describe_speedup([1.19, 0.99, 1.30], 1.203)
    'speed-up 1.19x (median of 3 alternated rounds, range 0.99-1.30) at packing factor 1.203: 0.99 of it; the \
rounds disagree by 0.31, more than the 0.19 measured: the machine was too loaded to tell'
    >>> print(describe_speedup([1.28], 1.031, "real-token ratio").split("; ")[1][:51])
    above the real-token ratio: more than packing saves
    """
    s = summary(speedups)
    rounds = f"{len(speedups)} alternated round{'s' if len(speedups) != 1 else ''}"
    line = (f"speed-up {s['median']:.2f}x (median of {rounds}, range {s['min']:.2f}-{s['max']:.2f}) at {promise} "
            f"{promised:.3f}: {s['median'] / promised:.2f} of it")
    spread, effect = s["max"] - s["min"], abs(s["median"] - 1.0)
    if spread > effect:
        line += (f"; the rounds disagree by {spread:.2f}, more than the {effect:.2f} measured: the machine was too "
                 f"loaded to tell")
    elif s["median"] > promised:
        line += f"; {ABOVE_THE_FACTOR.replace('packing factor', promise)}: {ABOVE_THE_FACTOR_WHY}"
    return line


def token_speedup(result: dict, name: str = "packed") -> tuple[list[float], float]:
    """(the rounds' speed-ups of `name` in real tokens/s, what packing promises them) of a
    measure_alternately result: the headline a speed-up table quotes."""
    return result["token_speedups"][name], promised_token_speedup(result, name)
