"""Tilings measured on the problem at hand: autotuning, tuning tables, the shipped defaults.

    tuned = kernelhub.autotune(train_step, params, batch)       # times candidates, shows progress
    tuned.save("moe_tiles.json")                                # only when asked, where asked
    with kernelhub.tuning.load("moe_tiles.json"):               # calls traced inside use it
        jax.jit(train_step)(params, batch)

`autotune(fn, *example_args, group_sizes=None, skew=2.0, draws=2, repeats=5, min_gain=0.03,
seed=0, progress=True, time_limit=None, on_entry=None, calls_per_sample=None, **example_kwargs)` traces `fn` (arrays or jax.ShapeDtypeStructs) and
times, for every grouped-matmul kernel it runs (forward, lhs_gradient and rhs_gradient passes
when it differentiates), each candidate tiling of the implementation that serves it:
  group_sizes: the caller's sizes (an int vector [num_groups], or several), else `draws` draws
    of Dirichlet(1 / skew) proportions of the rows (skew 0: balanced sizes; a sequence of skews
    times them all, e.g. (0, 2): balanced sizes and skewed draws);
  repeats: timing turns; each candidate's time is the median over the turns;
  min_gain: a candidate must beat the heuristic's tiling by this fraction to replace it, among
    all candidates and again when the two are timed alone on fresh operands;
  time_limit: seconds; a kernel is not started when the longest one so far would end past it,
    and it and the rest get no entry (the first kernel always runs);
  on_entry: called with (TuningKey, Entry) as each kernel's entry is decided (to save as you
    go: a tuning stopped from outside keeps what it finished);
  calls_per_sample: calls per draw made back to back in one timed sample, waited for once
    (None: 1 on a CPU, 5 on an accelerator, where a call waited for alone also times its
    round trip from the host).
It returns a `Tuning`. A call's tiling comes from, in order: an explicit `tiling` for its pass,
the active Tuning (`with tuning:`), the table shipped for this device kind, the heuristic.
Keys: device kind, implementation, op, pass, kernel, m/k/n rounded up to powers of two, group
counts and dtypes (TuningKey). docs/tuning.md has the whole story.
"""

from kernelhub._grouped_matmul.active_table import heuristic
from kernelhub._grouped_matmul.passes import TuningSpace
from kernelhub._grouped_matmul.problem import Kernel, Problem
from kernelhub._grouped_matmul.tables import Entry, Tuning, TuningKey, load, shipped
from kernelhub._grouped_matmul.tilings import PASSES, Tilings
from kernelhub.tuning._autotune import DEFAULT_SKEW, autotune

# The problem a tuned kernel call solves (its old name, kept for code written against it).
KernelProblem = Problem

__all__ = ["DEFAULT_SKEW", "Entry", "Kernel", "KernelProblem", "PASSES", "Problem", "Tilings",
           "Tuning", "TuningKey", "TuningSpace", "autotune", "heuristic", "load", "shipped"]
