"""The CPU benchmark's bookkeeping: which floor each ratio divides by, and what the table shows.

No timing here: speed lives in `kernelhub bench`, not in tests.
"""

from __future__ import annotations

import pytest

from kernelhub._cli.bench import cpu


def _result(groups: int, sizes: str, ours: float, floor: float, peer: float | None = None):
    case = cpu.Case("transposed_grouped_matmul", 4096, 1024, 1024, groups, "bfloat16", sizes)
    return cpu.Result(case, ours, floor, peer)


def test_cases_of_one_shape_share_its_best_floor():
    results = cpu.shared_floors([
        _result(8, "balanced", ours=0.020, floor=0.026),  # the floor's slow state
        _result(8, "skewed", ours=0.022, floor=0.010),  # its fast state
        _result(64, "balanced", ours=0.110, floor=0.100),
    ])
    assert [r.floor for r in results] == [0.010, 0.010, 0.100]
    assert results[0].vs_floor == 2.0
    assert [r.ours for r in results] == [0.020, 0.022, 0.110]


def test_table_cells_give_both_ragged_dot_ratios():
    cells = cpu._cells(_result(64, "skewed", ours=0.100, floor=0.080, peer=1.6))
    assert cells[cpu.COLUMNS.index("time / floor")] == "1.25"
    assert cells[cpu.COLUMNS.index("ragged_dot / kernelhub")] == "16x"
    assert cells[cpu.COLUMNS.index("ragged_dot / floor")] == "20x"
    no_peer = cpu._cells(_result(256, "skewed", ours=0.3, floor=0.3))
    assert no_peer[-3:] == ["-", "-", "-"]
    table = cpu.markdown([_result(8, "balanced", 0.02, 0.01)], "header")
    assert table.splitlines()[2] == "| " + " | ".join(cpu.COLUMNS) + " |"


def test_quantized_bench_gives_a_row_per_format(monkeypatch):
    """A row per format, for one format of each way the bench makes an operand (bf16 beside
    int8 weights with a scale per column, scale blocks of 128, a named block format), both
    operands quantized in the last two: each compiles its own gmm, and every format's numbers
    are tests/test_formats.py's (CI time)."""
    from kernelhub._cli.bench import quantized

    monkeypatch.setattr(quantized, "M", 64)
    monkeypatch.setattr(quantized, "K", 256)
    monkeypatch.setattr(quantized, "N", 32)
    kinds = ("bf16 x int8 weights (per column)", "e4m3 x e4m3 (blocks of 128 along k)",
             "mxfp8 x mxfp8")
    monkeypatch.setattr(quantized, "FORMATS", {name: quantized.FORMATS[name] for name in kinds})
    rows = quantized.measure(groups=2, reps=1, platform=None)
    assert [row[0] for row in rows] == list(kinds)
    assert all(len(row) == len(quantized.COLUMNS) and float(row[2]) > 0 for row in rows)


def test_cpu_bench_cases_take_the_users_shape():
    import argparse

    args = argparse.Namespace(quick=True, groups=None, shape=(64, 32, 16),
                              ops=["grouped_matmul"], dtypes=["float32"])
    assert {(case.m, case.k, case.n) for case in cpu.cases(args)} == {(64, 32, 16)}
    assert {case.groups for case in cpu.cases(args)} == {8, 64}


def test_epilogue_bench_checks_fused_against_unfused_and_gives_its_rows(monkeypatch, tmp_path):
    import argparse

    import numpy as np
    import pytest

    from kernelhub._cli.bench import epilogue

    # The bench refuses to time two functions whose results differ.
    with pytest.raises(AssertionError, match="not timing two different computations"):
        epilogue.check_agreement("x", np.ones(4), np.zeros(4) + 1.5, "float32")
    monkeypatch.setattr(epilogue, "QUICK_SHAPE", (64, 32, 16, 2))
    args = argparse.Namespace(quick=True, groups=None, dtypes=["float32"], reps=1, draws=1,
                              platform=None, out=tmp_path / "epilogue.md")
    done = epilogue.tables(args)
    compared, policies = done
    assert [row[:2] for row in compared.rows] == [["glu silu", "forward"],
                                                  ["glu silu", "forward + grad"]]
    assert [row[0] for row in policies.rows] == ["f32"]
    for row in compared.rows + policies.rows:
        assert float(row[-1]) <= epilogue.TOLERANCE["float32"]  # agreement, checked before timing
        assert all(cell != "-" for cell in row)  # every time and memory figure is there
    # The fused call keeps z [m, 2n] (float32 here) for its backward pass, also under a policy
    # that saves it by name; nothing_saveable keeps only what the step cannot recompute.
    (kept,) = (row.kept for row in policies.results)
    assert kept["no checkpoint"] == kept["save z"]
    assert kept["no checkpoint"] - kept["nothing_saveable"] >= 64 * 32 * 4
    monkeypatch.setattr(epilogue, "tables", lambda args, status=None: done)
    assert epilogue.run_epilogue(args) == 0
    written = (tmp_path / "epilogue.md").read_text()
    assert written.count("| glu silu |") == 2 and written.count("| f32 |") == 1


def test_gpu_bench_epilogue_rows_build_on_cpu():
    import jax.numpy as jnp

    from kernelhub._cli.bench import epilogue
    from kernelhub._cli.bench.gpu_measurement import SMOKE_SHAPES

    shard = SMOKE_SHAPES[1]  # 2 of 8 experts, at a group offset: rows outside stay 0
    rows = epilogue.measure_gpu(shard, jnp.float32, reps=1, warmup=0, platform="xla",
                                variants=epilogue.GPU_VARIANTS[1:])
    # Rows of kernels other than Triton's (the table's first) name theirs; GPT-OSS's weights
    # stored [G, 2n, k] too.
    assert [row.pass_name for row in rows] == [
        "bias + glu swiglu_oai, interleaved, forward (xla)",
        "bias + glu swiglu_oai, interleaved, forward + grad (xla)",
        "bias + glu swiglu_oai, interleaved, w [G, 2n, k], forward (xla)",
        "bias + glu swiglu_oai, interleaved, w [G, 2n, k], forward + grad (xla)"]
    assert all(row.max_relative_error < 1e-5 and row.ratio("unfused") for row in rows)
    lines = epilogue.gpu_markdown_lines(rows)
    assert lines[-5].startswith(
        "| smoke-shard | bias + glu swiglu_oai, interleaved, forward (xla) |")
    assert epilogue.gpu_record(rows[0])["pass"] == rows[0].pass_name


class _FollowerCostingClock:
    """A clock for timing tests: each function costs 1 ms, and the function called right after
    `slow_peer` 10 ms more (what an H100 showed at 0.2 ms kernels, in part, 2026-11-28)."""

    def __init__(self, slow_peer: str):
        self.now, self.last, self.order, self.slow_peer = 0.0, None, [], slow_peer

    def perf_counter(self) -> float:
        return self.now

    def thunk(self, name: str):
        import jax.numpy as jnp

        def run(*_):
            self.now += 1e-3 + (1e-2 if self.last == self.slow_peer else 0.0)
            self.last = name
            self.order.append(name)
            return jnp.zeros(())
        return run


def test_median_seconds_times_no_sample_after_another_function(monkeypatch):
    """Two thunks of one function get one time wherever their names stand: each sample comes
    after an untimed call of its own thunk, which pays for whatever ran before."""
    import types

    from kernelhub._cli.bench import timing
    from kernelhub._core import turns

    clock = _FollowerCostingClock(slow_peer="reference")
    monkeypatch.setattr(turns, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    names = ("reference", "table", "heuristic")
    seconds = timing.median_seconds({name: clock.thunk(name) for name in names}, reps=3,
                                    warmup=0)
    assert seconds["table"] == pytest.approx(1e-3)
    assert seconds["heuristic"] == pytest.approx(1e-3)
    timed = clock.order[len(names):]  # after each one's first (compiling) call
    assert timed[:6] == ["reference"] * 2 + ["table"] * 2 + ["heuristic"] * 2
    assert [timed[turn * 6] for turn in range(3)] == ["reference", "table", "heuristic"]


def test_interleaved_samples_start_each_turn_one_function_further_on():
    from kernelhub._cli.bench import timing

    clock = _FollowerCostingClock(slow_peer="")
    names = ("a", "b", "c", "d")
    timing.interleaved_samples([clock.thunk(name) for name in names], reps=4)
    turns = [clock.order[4 + 4 * turn:8 + 4 * turn] for turn in range(4)]
    assert turns == [["a", "b", "c", "d"], ["b", "c", "d", "a"], ["c", "d", "a", "b"],
                     ["d", "a", "b", "c"]]


def test_median_seconds_times_calls_back_to_back_and_waits_once(monkeypatch):
    """With calls_per_sample, a sample makes that many calls and waits for the last only: its
    time is the total over the calls. A thunk that fails before timing gets None."""
    import time

    import jax
    import jax.numpy as jnp

    from kernelhub._cli.bench import timing

    made, waits = [], []

    def slow():
        made.append(time.perf_counter())
        time.sleep(0.01)
        return jnp.zeros(())

    def broken():
        raise RuntimeError("no memory")

    real_wait = jax.block_until_ready
    monkeypatch.setattr(jax, "block_until_ready",
                        lambda value: (waits.append(len(made)), real_wait(value))[1])
    seconds = timing.median_seconds({"slow": slow, "broken": broken}, reps=3, warmup=1,
                                    calls_per_sample=4)
    assert seconds["broken"] is None
    # compile and one warm-up, then 3 samples of 4 calls, each after an untimed call
    assert len(made) == 2 + 3 * (1 + 4)
    # once after each warm-up call, each untimed call and each sample's last
    assert waits == [1, 2, 3, 7, 8, 12, 13, 17]
    assert 0.01 <= seconds["slow"] < 0.02  # per call, not per sample
