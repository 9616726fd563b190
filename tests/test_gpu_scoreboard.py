"""The GPU scoreboard's bookkeeping, checked on the CPU before a GPU is at hand: the roofline
arithmetic by hand, the result file's fields, the rows a run out of time still writes, and the
tuning table a GPU's device kind picks up. No kernel runs here (scripts/gpu_bench.sh's smoke
mode runs them: docs/gpu.md)."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from kernelhub._cli.bench import gpu_roofline, gpu_scoreboard, gpu_scoreboard_report
from kernelhub._cli.bench.gpu_measurement import SHAPES, SMOKE_SHAPES, Shape
from kernelhub._cli.bench.gpu_roofline import PassProblem

H100 = gpu_roofline.peak_for("NVIDIA H100 80GB HBM3")


def test_compulsory_bytes_and_flops_by_hand_with_a_group_offset_and_skewed_groups():
    # 10 rows, k=4, n=6; experts 2 and 3 of 4 are local (group_offset 2) with 5 and 2 rows:
    # R = 7 computed rows. bf16 values are 2 bytes, fp8 1 with a 4-byte scale per row/column.
    def problem(pass_name, dtype="bf16"):
        return PassProblem(pass_name, m=10, k=4, n=6, rows=7, local=2, dtype=dtype)

    assert {p: problem(p).flops for p in gpu_roofline.PASSES} == dict.fromkeys(
        gpu_roofline.PASSES, 2 * 7 * 4 * 6)
    # forward: x rows 7x4, weights 2x4x6 read; all 10x6 output rows written.
    assert problem("forward").compulsory_bytes == 2 * 28 + 2 * 48 + 2 * 60
    # lhs_gradient: dy rows 7x6, weights read; d x 10x4 written.
    assert problem("lhs_gradient").compulsory_bytes == 2 * 42 + 2 * 48 + 2 * 40
    # rhs_gradient: x rows 7x4 and dy rows 7x6 read; d w 2x4x6 written.
    assert problem("rhs_gradient").compulsory_bytes == 2 * 28 + 2 * 42 + 2 * 48
    # fp8: values 1 byte, plus a scale per computed row (7) and per expert and column (2x6).
    assert problem("forward", "fp8").compulsory_bytes == 28 + 4 * 7 + 48 + 4 * 12 + 2 * 60
    assert problem("lhs_gradient", "fp8").compulsory_bytes == 42 + 4 * 7 + 48 + 4 * 8 + 2 * 40
    # rhs_gradient's operands are quantized along the rows: a scale per k and per n.
    assert problem("rhs_gradient", "fp8").compulsory_bytes == 28 + 42 + 4 * (4 + 6) + 2 * 48

    # The scoreboard takes R from the pattern's sizes of the local experts only.
    shard = Shape("tiny", 10, 4, 6, 4, 2)
    sizes = gpu_scoreboard.group_sizes(10, 4, "skewed")
    assert gpu_scoreboard._problem(shard, "skewed", "forward", "bf16").rows == sizes[2:4].sum()


def test_roofline_fraction_and_rates_of_a_memory_bound_and_a_compute_bound_pass():
    # DeepSeek-V3's forward, 32 local experts of 64 rows: the weights dominate.
    small = PassProblem("forward", 16384, 7168, 2048, rows=2048, local=32, dtype="bf16")
    assert small.bound(H100) == "memory"
    floor = small.compulsory_bytes / 3.35e12
    assert small.roofline_seconds(H100) == pytest.approx(floor)
    figures = gpu_roofline.figures(small, H100, 2 * floor)
    assert figures["roofline_fraction"] == pytest.approx(0.5)
    assert figures["tbps"] == pytest.approx(3.35 / 2)
    assert figures["tflops"] == pytest.approx(small.flops / (2 * floor) / 1e12)
    # A square problem with many rows per expert is compute-bound; fp8 doubles the peak.
    big = PassProblem("forward", 65536, 8192, 8192, rows=65536, local=1, dtype="fp8")
    assert big.bound(H100) == "compute"
    assert big.roofline_seconds(H100) == pytest.approx(big.flops / 1979e12)
    assert gpu_roofline.figures(big, H100, None) == dict.fromkeys(
        ("seconds", "tflops", "tbps", "roofline_fraction"))


def test_peaks_come_from_one_table_by_device_kind():
    assert H100.name == "H100 SXM" and H100.tbps == 3.35 and H100.tflops == {"bf16": 989.0,
                                                                            "fp8": 1979.0}
    assert gpu_roofline.peak_for("NVIDIA H200").tbps == 4.8
    assert gpu_roofline.peak_for("NVIDIA H100 PCIe") is None  # not the SXM part
    assert gpu_roofline.peak_for("cpu") is None
    day = datetime.date(2026, 11, 27)
    assert gpu_scoreboard.folder_name("NVIDIA H100 80GB HBM3", day) == "2026-11-27-h100"
    assert gpu_scoreboard.folder_name("NVIDIA H200", day) == "2026-11-27-h200"


def test_a_run_out_of_time_writes_every_row_with_its_reason(tmp_path):
    # A budget of 0 s: no pass is measured (nothing compiles), yet every row is in the file.
    document = gpu_scoreboard.run_scoreboard(tmp_path, SMOKE_SHAPES, ("bf16", "fp8"), reps=1,
                                             warmup=0, smoke=True, budget=0.0, compile_threads=1)
    written = json.loads((tmp_path / "roofline.json").read_text())
    assert written == json.loads(json.dumps(document))
    assert {"date", "gpu", "jax", "rows"} <= set(written)
    rows = written["rows"]
    assert all(tuple(row) == gpu_roofline.ROW_FIELDS for row in rows)
    names = {row["implementation"] for row in rows}
    assert {"kernelhub:xla", "kernelhub:triton", "cublas_dense", "lax.ragged_dot",
            "tokamax:triton", "tokamax:mosaic"} <= names
    keys = {(r["dtype"], r["shape"], r["groups"], r["pass"]) for r in rows}
    assert len(keys) == 2 * len(SMOKE_SHAPES) * 2 * 3
    assert len(rows) == len(keys) * len(names)
    assert all(row["seconds"] is None and "time budget" in row["note"] for row in rows)
    # Exactly one kernelhub row per pass is the plain call's choice.
    for key in keys:
        assert sum(r["default"] for r in rows
                   if (r["dtype"], r["shape"], r["groups"], r["pass"]) == key) == 1
    table = (tmp_path / "roofline.md").read_text()
    # The table names the peak of the GPU it ran on; a CPU stands in the first peak (an H100).
    peak = gpu_roofline.peak_for(jax.devices()[0].device_kind) or gpu_roofline.PEAKS[0]
    assert "| bf16 | smoke-shard | skewed | rhs_gradient |" in table
    assert f"peak: {peak.name}" in table


def test_a_second_process_merges_its_implementations_into_the_table(tmp_path):
    """gpu_bench.sh measures the Mosaic GPU kernels in a process of their own (a fault in one
    kernel ends its process): the second run keeps the first's rows and adds its own."""
    run = functools.partial(gpu_scoreboard.run_scoreboard, tmp_path, SMOKE_SHAPES[:1], ("bf16",),
                            reps=1, warmup=0, smoke=True, budget=0.0, compile_threads=1)
    first = run(exclude=("kernelhub:mosaic",))
    assert "kernelhub:mosaic" not in {row["implementation"] for row in first["rows"]}
    second = run(only=("kernelhub:mosaic", "lax.ragged_dot"), merge=True)
    written = json.loads((tmp_path / "roofline.json").read_text())
    assert written == json.loads(json.dumps(second))
    keys = [(r["dtype"], r["shape"], r["groups"], r["pass"], r["implementation"])
            for r in written["rows"]]
    problems = 2 * 3  # one shape: two patterns, three passes
    # lax.ragged_dot's rows replaced (not doubled), one kernelhub:mosaic row per problem added
    assert len(keys) == len(set(keys)) == len(first["rows"]) + problems
    assert {r["implementation"] for r in written["rows"]} == (
        {r["implementation"] for r in first["rows"]} | {"kernelhub:mosaic"})
    assert "kernelhub:mosaic" in (tmp_path / "roofline.md").read_text()


def test_a_merge_keeps_measured_rows_over_rows_the_budget_left_unmeasured():
    """The first H100 merge lost lax.ragged_dot's measured rows to the second process's
    'budget spent' rows; a row without a time replaces only another without one."""
    def record(implementation, seconds, shape="a"):
        return {"dtype": "bf16", "shape": shape, "groups": "balanced", "pass": "forward",
                "implementation": implementation, "seconds": seconds}

    earlier = [record("lax.ragged_dot", 2.0), record("kernelhub:triton", 1.0),
               record("lax.ragged_dot", None, shape="b")]
    later = {"rows": [record("lax.ragged_dot", None), record("kernelhub:mosaic", None),
                      record("lax.ragged_dot", 3.0, shape="b")]}
    merged = gpu_scoreboard._merged(earlier, later)["rows"]
    assert sorted((r["shape"], r["implementation"], r["seconds"]) for r in merged) == [
        ("a", "kernelhub:mosaic", None), ("a", "kernelhub:triton", 1.0),
        ("a", "lax.ragged_dot", 2.0), ("b", "lax.ragged_dot", 3.0)]


def test_a_pass_is_checked_against_the_reference_and_tokamax_against_its_vjp():
    pytest.importorskip("tokamax")
    from kernelhub._cli.bench import gpu_scoreboard_calls

    shard = SMOKE_SHAPES[1]  # 2 of 8 experts at group_offset 2: peers get the local rows
    operands = gpu_scoreboard_calls.make_operands(shard, "skewed")
    calls = gpu_scoreboard_calls.calls(
        operands, "rhs_gradient", "bf16", ("xla",),
        only=("lax.ragged_dot", "tokamax:xla"))
    import jax

    with jax.numpy_dtype_promotion("standard"):  # tokamax's code, as the command runs it
        measured = {call.implementation: (seconds, note) for call, seconds, note, _ in
                    gpu_scoreboard.measure(calls, 1, 0, {}, ("t",), threads=1)}
    assert all(seconds is not None and seconds > 0 for seconds, _ in measured.values()), measured
    # Without kernelhub:xla (left out: it compiles slowly here), lax is the reference.
    assert measured["lax.ragged_dot"][1] == "the reference of the agreement checks"
    assert measured["tokamax:xla"][1].startswith("agrees with lax.ragged_dot")
    # tokamax's d rhs is the ragged dot its own VJP runs (its portable xla implementation here).
    assert measured["tokamax:xla"][1].endswith("the kernel call tokamax's VJP makes for this pass")


def test_a_tokamax_implementation_missing_here_says_which_import_failed(monkeypatch):
    """tokamax registers an implementation only where its module imports (0.0.17's Triton ragged
    dot needs jax-triton) and otherwise says only "Unknown implementation": the row names the
    import that failed. A tokamax laid out otherwise is left to report for itself."""
    import importlib
    import types

    from kernelhub._cli.bench import gpu_scoreboard_calls, gpu_tokamax

    package = "tokamax._src.ops.ragged_dot"
    api = types.SimpleNamespace(IMPLEMENTATIONS={"xla": None, "mosaic_gpu": None})
    real_import = importlib.import_module

    def import_module(name, *args):
        if name == f"{package}.api":
            return api
        if name == f"{package}.triton":  # found, but its own import fails
            raise ModuleNotFoundError("No module named 'jax_triton'", name="jax_triton")
        if name.startswith(package):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args)

    monkeypatch.setattr(gpu_tokamax.importlib, "import_module", import_module)
    tokamax = types.SimpleNamespace(__version__="0.0.17")
    assert gpu_tokamax.unavailable(tokamax, "mosaic") is None  # registered as mosaic_gpu
    assert gpu_tokamax.unavailable(tokamax, "xla") is None
    assert gpu_tokamax.unavailable(tokamax, "triton") == (
        "tokamax 0.0.17 has no triton implementation here "
        "(ModuleNotFoundError: No module named 'jax_triton')")
    monkeypatch.setattr(gpu_tokamax, "load", lambda: (tokamax, None))
    operands = gpu_scoreboard_calls.make_operands(SMOKE_SHAPES[0], "balanced")
    (triton,) = gpu_scoreboard_calls.calls(operands, "forward", "bf16", ("triton",),
                                           only=("tokamax:triton",))
    assert triton.fn is None and "No module named 'jax_triton'" in triton.note

    api.IMPLEMENTATIONS = None  # not a layout this check knows: the call speaks for itself
    assert gpu_tokamax.unavailable(tokamax, "triton") is None


def test_the_vjp_check_finds_kernels_on_a_mesh_as_well_as_on_a_grid():
    """tokamax's Hopper kernels are Mosaic GPU kernels on a mesh (plgpu.kernel, which traces to
    mpmd_map), not pallas_calls: the check of its gradient passes against its VJP found no
    kernel in either (H100, 2026-11-28: "runs 0 kernel call(s), its VJP 0")."""
    import jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from kernelhub._cli.bench import gpu_tokamax

    def add_one(x_ref, out_ref):
        out_ref[...] = x_ref[...] + 1

    kernel = plgpu.kernel(add_one, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                          grid=(2,), grid_names=("i",), kernel_name="add_one")
    calls = gpu_tokamax.kernel_calls(jax.jit(lambda x: kernel(x) * 2), jnp.zeros(128))
    assert [call[1:] for call in calls] == [("add_one", "((2,),)", "float32[128]")]


def test_peers_given_the_local_rows_say_what_they_do_not_write():
    """At a shard (2 of 8 experts at an offset) the peers get the local rows only: their notes
    say how many MB of the output's other rows, which the roofline counts and kernelhub's
    call writes, they leave out; the weight gradient's output is the local experts' alone."""
    from kernelhub._cli.bench import gpu_scoreboard_calls

    shard = SMOKE_SHAPES[1]
    operands = gpu_scoreboard_calls.make_operands(shard, "balanced")
    others = shard.m - operands.rows
    assert 0 < others < shard.m
    notes = {pass_name: gpu_scoreboard_calls.local_rows_note(operands, pass_name)
             for pass_name in gpu_roofline.PASSES}
    assert notes["forward"] == (
        f"given the local rows only (no group_offset): {others * shard.n * 2 / 1e6:.3g} MB of "
        f"the roofline's bytes, the other experts' rows of the output, not written")
    assert f"{others * shard.k * 2 / 1e6:.3g} MB" in notes["lhs_gradient"]
    assert notes["rhs_gradient"] is None
    whole = gpu_scoreboard_calls.make_operands(SMOKE_SHAPES[0], "balanced")
    assert gpu_scoreboard_calls.local_rows_note(whole, "forward") is None
    (lax,) = gpu_scoreboard_calls.calls(operands, "forward", "bf16", (), only=("lax.ragged_dot",))
    assert lax.note == notes["forward"]


def test_kernelhubs_weight_gradient_takes_x_as_training_holds_it():
    """bf16 rhs_gradient: kernelhub's call gets x [m, k] and transposes it inside the timed
    function, as a training step's weight gradient does (tokamax also gets x), and agrees."""
    from kernelhub._cli.bench import gpu_scoreboard_calls

    shard = SMOKE_SHAPES[1]
    operands = gpu_scoreboard_calls.make_operands(shard, "skewed")
    calls = gpu_scoreboard_calls.calls(operands, "rhs_gradient", "bf16", ("triton",),
                                       only=("lax.ragged_dot", "kernelhub:triton"))
    ours = next(call for call in calls if call.implementation == "kernelhub:triton")
    assert ours.args[0].shape == operands.x.shape
    measured = {call.implementation: note for call, _, note, _ in
                gpu_scoreboard.measure(calls, 1, 0, {}, ("t",), threads=1)}
    assert measured["kernelhub:triton"].startswith("agrees with lax.ragged_dot"), measured


def test_the_table_shows_fractions_beside_the_peers():
    problem = PassProblem("forward", 10, 4, 6, rows=7, local=2, dtype="bf16")
    slow = 4 * problem.roofline_seconds(H100)
    rows = [gpu_roofline.row("tiny", "skewed", problem, "kernelhub:triton", True, H100, slow),
            gpu_roofline.row("tiny", "skewed", problem, "tokamax:mosaic", False, H100, None,
                             "NotImplementedError: Not supported on cpu.")]
    document = {"date": "d", "gpu": "g", "jax": "j", "tokamax": "t", "timing": "t", "mode": "m",
                "peak": {**H100.record(), "named": "H100 SXM (spec sheet)"}, "rows": rows}
    table = gpu_scoreboard_report.markdown(document)
    line = next(line for line in table.splitlines() if line.startswith("| bf16 | tiny"))
    assert line.endswith("| 0.25* | - |") and "| memory | kernelhub:triton |" in line
    assert "- tokamax:mosaic: NotImplementedError: Not supported on cpu." in table


def test_a_tuning_table_named_for_a_gpu_device_kind_is_picked_on_that_gpu(monkeypatch, tmp_path):
    import importlib.resources

    import jax
    import jax.numpy as jnp

    import kernelhub
    from kernelhub._grouped_matmul import active_table, tables
    from kernelhub.tuning import _autotune

    kind = "NVIDIA H100 80GB HBM3"
    assert tables._file_name(kind) == "nvidia-h100-80gb-hbm3.json"
    assert tables._file_name("NVIDIA H200") == "nvidia-h200.json"
    # Trace a call as if on that GPU (the xla implementation stands in for Triton's kernels).
    monkeypatch.setattr(tables, "device_kind", lambda: kind)
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    recorder = _autotune.Recorder()
    with active_table.activated(recorder):
        jax.eval_shape(lambda x, w, s: gmm(x, w, s), jax.ShapeDtypeStruct((64, 32), jnp.bfloat16),
                       jax.ShapeDtypeStruct((4, 32, 16), jnp.bfloat16),
                       jax.ShapeDtypeStruct((4,), jnp.int32))
    (key, call), = recorder.calls.items()
    assert key.device_kind == kind
    tiling = tuple(call.space.default(call.problem))
    folder = tmp_path / "tuning" / "defaults"
    folder.mkdir(parents=True)
    tables.Tuning({key: tables.Entry(tiling, tiling, 1.0, 1.0, "balanced")}).save(
        folder / tables._file_name(kind))
    monkeypatch.setattr(importlib.resources, "files", lambda package: tmp_path)
    tables.shipped.cache_clear()
    try:
        assert tables.shipped_tiling(call) == tiling
        monkeypatch.setattr(tables, "device_kind", lambda: "NVIDIA H200")  # no file: heuristic
        assert tables.shipped_tiling(call) is None
    finally:
        tables.shipped.cache_clear()


def test_the_default_row_is_the_platform_whose_kernel_a_plain_call_lowers():
    """lowered_platform reads the kernels in a plain call's lowering for cuda: here (no GPU
    table, so no per-call choice) the Triton kernel, as kernelhub.resolve says."""
    import jax
    import jax.numpy as jnp

    import kernelhub
    from kernelhub._cli.bench import gpu_scoreboard_calls

    x = jax.ShapeDtypeStruct((128, 64), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((4, 64, 128), jnp.bfloat16)
    sizes = jax.ShapeDtypeStruct((4,), jnp.int32)
    gmm = jax.jit(lambda x, w, s: kernelhub.grouped_matmul(x, w, s))
    assert gpu_scoreboard_calls.lowered_platform(gmm, (x, w, sizes)) == "triton"
    # Nothing to read (a function without a kernel): None, and the registered default marks it.
    assert gpu_scoreboard_calls.lowered_platform(jax.jit(lambda x: x * 2), (x,)) is None


def test_the_lowering_is_read_only_where_a_table_can_choose(monkeypatch):
    """The shipped CPU table times one implementation (xla): no export per pass is spent; the
    H100's holds both Hopper kernels' times, as may a table named by KERNELHUB_TUNING. (The
    device kinds are named: the first device is the GPU where the GPU runs these tests.)"""
    from kernelhub._cli.bench import gpu_scoreboard_calls

    monkeypatch.delenv("KERNELHUB_TUNING", raising=False)
    assert not gpu_scoreboard_calls._tables_may_choose("cpu")
    assert gpu_scoreboard_calls._tables_may_choose("NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("KERNELHUB_TUNING", "/tmp/table.json")
    assert gpu_scoreboard_calls._tables_may_choose("cpu")


def test_a_scoreboard_run_becomes_a_table_of_each_kernels_times_at_its_shapes(tmp_path):
    """gpu_scoreboard_table files each measured pass under the keys a plain call and a
    training step look up on that GPU (both ops), with the tiling its rows ran (else the
    heuristic's) and the mean of the balanced and skewed times; what was not measured gets no
    entry."""
    from kernelhub._cli.bench import gpu_scoreboard_table
    from kernelhub._grouped_matmul import tables
    from kernelhub._pallas.mosaic_gpu import heuristic as mosaic_heuristic

    kind = "NVIDIA H100 80GB HBM3"
    seconds = {"triton": 1e-3, "mosaic": 2e-3}
    rows = [{"dtype": "bf16", "shape": shape.name, "groups": groups, "pass": pass_name,
             "implementation": f"kernelhub:{platform}",
             "seconds": None if (shape.name, platform) == ("smoke-shard", "mosaic") else
             base * (1 + index) * (1.5 if groups == "skewed" else 1.0)}
            for shape in SMOKE_SHAPES for platform, base in seconds.items()
            for index, pass_name in enumerate(gpu_roofline.PASSES)
            for groups in ("balanced", "skewed")]
    ran = {"forward": [32, 32, 64, 4, 4], "lhs_gradient": [32, 32, 64, 4, 3],
           "rhs_gradient": [32, 32, 32, 4, 4]}
    for row in rows:  # the Triton rows say which tiling they ran; the Mosaic GPU rows do not
        if row["implementation"] == "kernelhub:triton":
            row["tilings"] = [{"kernel": "?", "tiling": ran[row["pass"]]}]
    rows.append({**rows[0], "dtype": "fp8", "seconds": 9.0})  # not a bf16 problem: ignored
    document = {"gpu": kind, "date": "2026-11-27T06:06:35", "jax": "0.11.2", "rows": rows}
    made = gpu_scoreboard_table.table(document, SMOKE_SHAPES)
    made.save(tmp_path / "table.json")
    entries = tables.load(tmp_path / "table.json").entries
    assert {key.device_kind for key in entries} == {kind}
    kernel_of_pass = {"forward": "gmm", "lhs_gradient": "gmm_t", "rhs_gradient": "tgmm"}
    pass_of_kernel = {kernel: pass_name for pass_name, kernel in kernel_of_pass.items()}
    for key, entry in entries.items():
        ran_here = (tuple(ran[pass_of_kernel[key.problem.kernel.value]])
                    if key.implementation == "triton" else
                    mosaic_heuristic.heuristic(key.problem).as_tiling())
        assert entry.tiling == entry.default_tiling == ran_here
        assert entry.candidates == ((entry.tiling, entry.tuned_ms),)
    plain = {(key.implementation, key.problem.local_groups, key.pass_name): entry.tuned_ms
             for key, entry in entries.items() if key.op == "grouped_matmul"}
    for platform, base in seconds.items():
        for index, pass_name in enumerate(gpu_roofline.PASSES):
            assert plain[(platform, 4, pass_name)] == pytest.approx(base * 1e3 * (1 + index) * 1.25)
            assert [key.problem.kernel.value for key in entries
                    if (key.implementation, key.problem.local_groups, key.pass_name,
                        key.op) == (platform, 4, pass_name, "grouped_matmul")] == [
                kernel_of_pass[pass_name]]
    assert ("triton", 2, "forward") in plain and ("mosaic", 2, "forward") not in plain
    # tgmm's own forward is the scoreboard's rhs_gradient problem.
    tgmm_forward = [entry.tuned_ms for key, entry in entries.items()
                    if key.op == "transposed_grouped_matmul" and key.pass_name == "forward"
                    and key.implementation == "triton" and key.problem.local_groups == 4]
    assert tgmm_forward == [pytest.approx(seconds["triton"] * 1e3 * 3 * 1.25)]
    # `without` leaves out the rows it names: one kernel's pass at every shape, or one
    # implementation at one shape; the rest stay as they were.
    left = gpu_scoreboard_table.table(
        document, SMOKE_SHAPES, without=(("kernelhub:triton", "*", "rhs_gradient"),
                                         ("kernelhub:mosaic", "smoke", "*")))
    kept = {key: entry for key, entry in entries.items()
            if not (key.implementation == "triton" and key.problem.kernel.value == "tgmm")
            and key.implementation != "mosaic"}
    assert left.entries == kept and any(key.implementation == "triton" for key in kept)


def test_a_scoreboard_with_heuristic_rows_files_the_faster_tiling_of_each_pass():
    """Rows of a kernel under the table and under the heuristic (KERNELHUB_GPU_HEURISTIC_ROWS):
    each pass's entry takes the table's tiling only where it ran faster than the heuristic's by
    more than 3%, else the heuristic's, with both times; rows of one tiling under both are one
    measurement; `without` leaves out a kernel's heuristic rows too."""
    from kernelhub._cli.bench import gpu_scoreboard_table

    shape = SMOKE_SHAPES[0]
    heuristic, tabled = (32, 32, 64, 4, 4), (64, 32, 64, 4, 3)
    # (pass, ms of the table's tiling, ms of the heuristic's, whether the table's is another)
    cases = [("forward", 1.0, 0.9, True), ("lhs_gradient", 0.5, 1.0, True),
             ("rhs_gradient", 1.2, 1.0, False)]
    rows = []
    for pass_name, table_ms, heuristic_ms, other in cases:
        for groups in ("balanced", "skewed"):
            for name, ms, tiling in (("kernelhub:triton", table_ms, tabled if other else
                                      heuristic),
                                     ("kernelhub:triton@heuristic", heuristic_ms, heuristic)):
                rows.append({"dtype": "bf16", "shape": shape.name, "groups": groups,
                             "pass": pass_name, "implementation": name, "seconds": ms * 1e-3,
                             "tilings": [{"kernel": "?", "tiling": list(tiling)}]})
    assert rows[1]["implementation"] == "kernelhub:triton@heuristic"
    rows.append({**rows[1], "seconds": 0.9e-3})  # one more of the heuristic's forward rows
    document = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-28T01:49:00", "jax": "0.11.2",
                "rows": rows}
    made = gpu_scoreboard_table.table(document, (shape,))
    by_pass = {key.pass_name: entry for key, entry in made.entries.items()
               if key.op == "grouped_matmul"}
    assert (by_pass["forward"].tiling, by_pass["forward"].default_tiling) == (heuristic,) * 2
    assert by_pass["forward"].tuned_ms == pytest.approx(0.9)
    assert dict(by_pass["forward"].candidates) == pytest.approx({heuristic: 0.9, tabled: 1.0})
    assert by_pass["lhs_gradient"].tiling == tabled
    assert (by_pass["lhs_gradient"].tuned_ms, by_pass["lhs_gradient"].default_ms) == (
        pytest.approx(0.5), pytest.approx(1.0))
    assert by_pass["rhs_gradient"].tiling == heuristic
    assert by_pass["rhs_gradient"].tuned_ms == pytest.approx(1.1)  # both rows, one tiling
    # The table's tiling faster, but within the gain (the forward's times as above, the
    # table's rows at 0.89 ms): the rule alone, as the table above applied it (each table
    # traces both kernels' training steps again).
    close = gpu_scoreboard_table._entry({tabled: [0.89, 0.89], heuristic: [0.9, 0.9, 0.9]},
                                        heuristic, document)
    assert (close.tiling, close.tuned_ms) == (heuristic, pytest.approx(0.9))
    assert not gpu_scoreboard_table.table(
        document, (shape,), without=(("kernelhub:triton", "*", "*"),)).entries


def test_a_table_tuned_for_gmm_is_completed_with_tgmms_keys_of_the_same_kernels():
    """scripts/gpu_bench.sh tunes `--ops gmm` only: its three kernels are also tgmm's (tgmm's
    forward is gmm's weight gradient, its gradients gmm's two other kernels), so completed()
    files the same entries under tgmm's keys."""
    from kernelhub._cli.bench import gpu_scoreboard_table
    from kernelhub._grouped_matmul import tables

    kind = "NVIDIA H100 80GB HBM3"
    shape = SMOKE_SHAPES[1]
    step, args = gpu_scoreboard_table._training_step("grouped_matmul", shape, "triton")
    gmm_entries = {}
    for index, call in enumerate(gpu_scoreboard_table.recorded(step, *args)):
        tiling = tuple(call.space.default(call.problem))
        key = tables.TuningKey.of(kind, "triton", call.op, call.pass_name, call.problem)
        gmm_entries[key] = tables.Entry(tiling, tiling, 1.0 + index, 1.0 + index, "balanced")
    assert len(gmm_entries) == 3
    done = gpu_scoreboard_table.completed(tables.Tuning(gmm_entries), (shape,))
    added = {key: entry for key, entry in done.entries.items() if key not in gmm_entries}
    assert {(key.op, key.pass_name, key.problem.kernel.value) for key in added} == {
        ("transposed_grouped_matmul", "forward", "tgmm"),
        ("transposed_grouped_matmul", "lhs_gradient", "gmm_t"),
        ("transposed_grouped_matmul", "rhs_gradient", "gmm")}
    by_kernel = {key.problem: entry for key, entry in gmm_entries.items()}
    assert all(by_kernel[key.problem] == entry for key, entry in added.items())


def test_kernelhub_rows_name_the_tiling_each_kernel_call_ran():
    """kernel_tilings traces a pass: its kernel and the heuristic's tiling, or the tiling of
    the table in force (as KERNELHUB_TUNING or a shipped table would give it)."""
    import jax
    import jax.numpy as jnp

    import kernelhub
    from kernelhub._cli.bench import gpu_scoreboard_calls
    from kernelhub._grouped_matmul import active_table, tables
    from kernelhub._grouped_matmul.problem import Problem
    from kernelhub._pallas.gpu import config as triton_config
    from kernelhub.tuning import _autotune

    shape = SMOKE_SHAPES[0]
    gmm = kernelhub.get("grouped_matmul", platform="triton")
    fn = gpu_scoreboard_calls._pass_function(gmm, "forward", shape)
    args = (jax.ShapeDtypeStruct((shape.m, shape.k), jnp.bfloat16),
            jax.ShapeDtypeStruct((shape.local, shape.k, shape.n), jnp.bfloat16),
            jax.ShapeDtypeStruct((shape.experts,), jnp.int32))
    problem = Problem("gmm", shape.m, shape.k, shape.n, shape.experts, shape.local,
                      "bfloat16", "bfloat16", "bfloat16", False)
    heuristic = list(triton_config.heuristic(problem).as_tiling())
    assert gpu_scoreboard_calls.kernel_tilings(fn, args) == [{"kernel": "gmm",
                                                              "tiling": heuristic}]
    recorder = _autotune.Recorder()
    with active_table.activated(recorder):
        jax.eval_shape(fn, *args)
    (key,) = recorder.calls
    tiling = (32, 32, 16, 4, 2)
    with tables.Tuning({key: tables.Entry(tiling, tiling, 1.0, 1.0, "balanced")}):
        assert gpu_scoreboard_calls.kernel_tilings(fn, args) == [{"kernel": "gmm",
                                                                  "tiling": list(tiling)}]
        # Heuristic rows: the tabled kernels again, lowered with every table off.
        ops = gpu_scoreboard_calls.make_operands(shape, "balanced")
        operands = gpu_scoreboard_calls.pass_operands(ops, "forward", "bf16")
        made = {call.implementation: call for call in gpu_scoreboard_calls.kernelhub_calls(
            ops, "forward", "bf16", operands, heuristic_rows=True)}
        assert made["kernelhub:triton"].tilings == [{"kernel": "gmm", "tiling": list(tiling)}]
        under = made["kernelhub:triton@heuristic"]
        assert under.tilings == [{"kernel": "gmm", "tiling": heuristic}] and not under.default
        assert "kernelhub:xla@heuristic" not in made  # no GPU table tiles the XLA loops
        observer = tables.Observer(None)
        with active_table.activated(observer):  # the table in force while it lowers: none
            under.fn.lower(*under.args)
        assert observer.calls == []


def test_mosaic_profile_passes_run_the_kernel_each_names():
    """Each profiled pass, traced at a smoke shape, makes one Mosaic GPU kernel call: the
    forward gmm (also with bands of every column tile), the forward on weights stored
    [G, n, k] and the lhs gradient gmm_t (at transposed sizes), the weight gradient tgmm (also
    over spans of 8 groups); the forward probes in tilings of their own (warp-specialized,
    deeper, wider, two programs per SM). The probes' schedule knobs last only while their
    pass is traced."""
    from kernelhub._cli.bench import gpu_scoreboard_calls as calls
    from kernelhub._cli.bench import mosaic_profile
    from kernelhub._grouped_matmul import visits
    from kernelhub._pallas.mosaic_gpu import grouped_matmul

    shape = SMOKE_SHAPES[1]
    ops = calls.make_operands(shape, "balanced")
    kernels, tilings = {}, {}
    for pass_name in mosaic_profile.PASSES:
        args, make = mosaic_profile._pass(ops, shape, pass_name)
        with mosaic_profile.schedule_knob(pass_name):
            assert grouped_matmul.WHOLE_ROWS_FOR_ONE_TILE_GROUPS == (
                pass_name != "forward_banded")
            assert visits.SPREAD_FILLS == pass_name.endswith("_spread_fills")
            (ran,) = calls.kernel_tilings(make(), args)
        kernels[pass_name] = ran["kernel"]
        tilings[pass_name] = mosaic_profile.explicit_tiling(shape, pass_name)
    assert grouped_matmul.WHOLE_ROWS_FOR_ONE_TILE_GROUPS
    assert not visits.SPREAD_FILLS
    assert kernels == {"forward": "gmm", "forward_k_major": "gmm_t",
                       "forward_banded": "gmm", "forward_warp_specialized": "gmm",
                       "forward_warp_specialized_float32": "gmm",
                       "forward_deep": "gmm", "forward_wide": "gmm",
                       "forward_two_per_sm": "gmm",
                       "forward_spread_fills": "gmm", "lhs_gradient_spread_fills": "gmm_t",
                       "lhs_gradient": "gmm_t",
                       "rhs_gradient": "tgmm", "rhs_gradient_spans": "tgmm",
                       "rhs_gradient_warp_specialized": "tgmm"}
    assert tilings == {**dict.fromkeys(kernels), "rhs_gradient_spans": (64, 64, 64, 4, 1, 8),
                       "forward_warp_specialized": (128, 64, 256, 3, 2),
                       "forward_warp_specialized_float32": (128, 64, 256, 3, 2),
                       "forward_deep": (64, 64, 128, 8), "forward_wide": (64, 64, 256, 4),
                       "forward_two_per_sm": (64, 64, 128, 3, 1, 1, 0, 2),
                       "rhs_gradient_warp_specialized": (64, 64, 128, 4, 2)}
    # Each probe's tiling is one the kernel takes as it is at the shapes the GPU profiles.
    from kernelhub._grouped_matmul.problem import Kernel, Problem
    from kernelhub._pallas.mosaic_gpu import config as mosaic_config

    for profiled in (s for s in SHAPES if s.name in ("deepseek-v3", "qwen3-moe")):
        problem = Problem(Kernel.GMM, profiled.m, profiled.k, profiled.n, profiled.experts,
                          profiled.local, "bfloat16", "bfloat16", "bfloat16", False)
        for tiling in mosaic_profile.TILED_FORWARDS.values():
            assert mosaic_config.from_tiling(tiling, problem).as_tiling() == tiling
        weights = dataclasses.replace(problem, kernel=Kernel.TGMM)
        for pass_name in ("rhs_gradient_spans", "rhs_gradient_warp_specialized"):
            tiling = mosaic_profile.explicit_tiling(profiled, pass_name)
            assert mosaic_config.from_tiling(tiling, weights).as_tiling() == tiling
    megabytes, read, write = mosaic_profile.weight_stream(ops.w, repeats=2)
    assert megabytes == ops.w.size * 2 / 1e6 and read > 0 and write > 0  # bf16, once each


def test_mosaic_profile_sums_each_warpgroups_regions_by_hand():
    """mosaic_profile reads Mosaic GPU's trace events (begin/end per region and warpgroup):
    one warpgroup of two work items (two steps, then one), 10 us waited between the first
    item's steps; one that ran no work item is left out of the means."""
    from kernelhub._cli.bench import mosaic_profile
    from kernelhub._pallas.mosaic_gpu import profiling

    assert profiling.compiler_params_fields() == {}
    with profiling.profiled("/tmp/traces", 64):
        assert profiling.compiler_params_fields() == dict(profile_space=64,
                                                          profile_dir="/tmp/traces")
    assert profiling.compiler_params_fields() == {}

    def region(tid, name, begin, end):
        return [{"name": name, "ph": "B", "ts": begin, "tid": tid},
                {"name": name, "ph": "E", "ts": end, "tid": tid}]

    events = (region(1, "sums", 0, 50) + region(1, "step", 5, 15) + region(1, "step", 25, 40)
              + region(1, "store", 50, 60) + region(1, "sums", 60, 80)
              + region(1, "step", 62, 70) + region(1, "store", 80, 100)
              + region(2, "store", 0, 5))
    per_trace = mosaic_profile.region_times(events[::-1])  # any order
    assert per_trace[1] == dict(span=100, totals={"sums": 70, "step": 33, "store": 30},
                                counts={"sums": 2, "step": 3, "store": 2}, between_steps=10)
    found = mosaic_profile.summary(per_trace)
    assert found["warpgroups"] == 1 and found["items"] == 2 and found["steps"] == 3
    assert found["us_per_item"] == 50
    assert (found["sums_share"], found["step_share"], found["store_share"],
            found["between_steps_share"]) == pytest.approx((0.7, 0.33, 0.3, 0.1))
    # The buffer is sized from above: DeepSeek-V3's forward on 64x64x128 tiles has
    # (16384 / 64 + 256 visits) x 16 column tiles over 132 programs, 63 each, of 2 regions
    # and 7168 / 64 steps; its tgmm, 32 x 56 x 16 items, 218 each, of 2 regions and 2 steps.
    deepseek = next(shape for shape in SHAPES if shape.name == "deepseek-v3")
    # The 32 local groups' 2048 rows: (32 + 64) x 16 visits, at most 12 a program (3.9 ran
    # on the H100), each of a pipeline, 112 steps and a store.
    assert mosaic_profile.regions_for(deepseek, "forward", "gmm", [64, 64, 128, 4]) == \
        12 * (2 + 112) + 32
    assert mosaic_profile.regions_for(deepseek, "rhs_gradient", "tgmm",
                                      [64, 128, 128, 4, 1, 1, 0, 2]) == 109 * (2 + 2) + 32
    # Over spans of 8 groups: 4 x 56 x 16 items, 28 each, of a pipeline region and 8 groups'
    # steps (up to 2 chunks each) and stores.
    assert mosaic_profile.regions_for(deepseek, "rhs_gradient_spans", "tgmm",
                                      [64, 128, 128, 4, 1, 8]) == 28 * (1 + 8 * 2 + 8) + 32
    # Two programs per SM: 264 programs, at most 6 visits each.
    assert mosaic_profile.regions_for(deepseek, "forward_two_per_sm", "gmm",
                                      [64, 64, 128, 3, 1, 1, 0, 2]) == 6 * (2 + 112) + 32
    # A probe's bytes are its pass's: the weight gradient's 2048 rows of x and dy read, 32
    # experts' [7168, 2048] gradients written; the deeper forward's as the forward's.
    assert mosaic_profile.compulsory_bytes(deepseek, 2048, "rhs_gradient_spans") == (
        2 * (2048 * 7168 + 2048 * 2048 + 32 * 7168 * 2048))
    assert mosaic_profile.compulsory_bytes(deepseek, 2048, "forward_deep") == (
        mosaic_profile.compulsory_bytes(deepseek, 2048, "forward"))
    # A float32 output writes all 16384 x 2048 elements in 4 bytes, not 2.
    assert mosaic_profile.compulsory_bytes(
        deepseek, 2048, "forward_warp_specialized_float32") == (
        mosaic_profile.compulsory_bytes(deepseek, 2048, "forward") + 2 * 16384 * 2048)
    found["tiling"] = (64, 128, 128, 2, 1, 1, 0, 2)
    found["tbps"] = 2.5
    table = mosaic_profile.report([("deepseek-v3", "rhs_gradient", found),
                                   ("qwen3-moe", "forward", "failed: ValueError: x")],
                                  {"deepseek-v3": (939.5, 2.914, 2.6)})
    assert ("| deepseek-v3 | rhs_gradient | 64x128x128x2x1x1x0x2 | 1 | 100 | 2.50 | 2.0 | "
            "50.00 | 3 | 0.70 | 0.33 | 0.10 | 0.30 |") in table
    assert "| qwen3-moe | forward | failed: ValueError: x |" in table
    assert "| deepseek-v3 | 940 | 2.91 | 2.60 |" in table


# The first line of ncu's details page as CSV (--csv --page details).
NCU_HEADER = ('"ID","Process ID","Kernel Name","Section Name","Metric Name","Metric Unit",'
              '"Metric Value"')


def test_kernel_counters_cases_launch_one_kernel_each_and_the_csv_becomes_rows():
    """Each case of the Nsight Compute run traces, at a smoke shape, to one kernel call of its
    platform's kind (so the n-th profiled launch is the n-th case's); ncu's details page (its
    CSV after its own log lines) becomes one row per launch, in launch order, and a case with
    no launch says so."""
    from kernelhub._cli.bench import gpu_scoreboard_calls as calls
    from kernelhub._cli.bench import kernel_counters, mosaic_profile
    from kernelhub._grouped_matmul import visits

    shape = SMOKE_SHAPES[1]
    made = kernel_counters.case_calls(shape)
    assert [label for label, _, _ in made] == [f"smoke-shard: {label}"
                                                for label, _, _ in kernel_counters.CASES]
    kinds = []
    for (label, make, args), (_, platform, pass_name) in zip(made, kernel_counters.CASES):
        with mosaic_profile.schedule_knob(pass_name):
            assert visits.SPREAD_FILLS == pass_name.endswith("_spread_fills")
            (ran,) = calls.kernel_tilings(make(), args)
        kinds.append((platform, ran["kernel"]))
    assert kinds == [("mosaic", "gmm"), ("triton", "gmm"), ("mosaic", "gmm_t"),
                     ("mosaic", "gmm"), ("mosaic", "gmm_t"), ("triton", "gmm_t"),
                     ("mosaic", "gmm_t"), ("triton", "gmm_t"), ("mosaic", "tgmm"),
                     ("triton", "tgmm")]

    header = NCU_HEADER
    rows = [
        ("1", "kernelhub_transposed_grouped_matmul", "GPU Speed Of Light Throughput",
         "Duration", "usecond", "812.22"),
        ("0", "kernelhub_grouped_matmul_mosaic_gpu_kernel", "GPU Speed Of Light Throughput",
         "DRAM Throughput", "%", "51.20"),
        ("0", "kernelhub_grouped_matmul_mosaic_gpu_kernel", "GPU Speed Of Light Throughput",
         "Duration", "usecond", "640.10"),
        ("0", "kernelhub_grouped_matmul_mosaic_gpu_kernel", "Memory Workload Analysis",
         "Memory Throughput", "Tbyte/second", "1.72"),
    ]
    text = ("==PROF== Connected to process 7\n" + header + "\n"
            + "\n".join(",".join(f'"{v}"' for v in (r[0], "7", *r[1:])) for r in rows) + "\n")
    launches = kernel_counters.kernel_rows(text)
    assert [launch["kernel"] for launch in launches] == [
        "kernelhub_grouped_matmul_mosaic_gpu_kernel", "kernelhub_transposed_grouped_matmul"]
    assert launches[0]["metrics"][("GPU Speed Of Light Throughput", "DRAM Throughput")] == (
        "51.20 %")
    table = kernel_counters.report(["a: mosaic forward", "a: mosaic rhs_gradient", "a: more",
                                    "b: mosaic forward"], [*launches, None],
                                   {"a: mosaic forward": [[128, 64, 256, 3, 2]]})
    assert ("| a: mosaic forward | 128x64x256x3x2 | kernelhub_grouped_matmul_mosaic_gpu_kernel "
            "| 640.10 usecond | 51.20 % | 1.72 Tbyte/second | - |") in table
    assert "| a: mosaic rhs_gradient | ? | kernelhub_transposed_grouped_matmul |" in table
    assert "| a: more | ? | not profiled |" in table
    assert "| b: mosaic forward | ? | not profiled |" in table
    assert kernel_counters.kernel_rows("==ERROR== ERR_NVGPUCTRPERM\n") == []
    command = kernel_counters.ncu_command("ncu", pathlib.Path("/tmp/c"), "qwen3-moe")
    assert command[:5] == ["ncu", "--target-processes", "all", "--kernel-name",
                           "regex:kernelhub"]
    assert "/tmp/c/counters-qwen3-moe.csv" in command
    assert command[-5:] == ["--target", "--out", "/tmp/c", "--shapes", "qwen3-moe"]


def test_kernel_counters_runs_ncu_once_per_shape_and_keeps_what_finished(tmp_path,
                                                                          monkeypatch):
    """With a stand-in ncu on PATH (it writes a details page for DeepSeek-V3's run and fails
    Qwen3-MoE's with no page): one ncu run per shape, each logging to its own CSV; counters.md
    holds the first shape's launches and says the second's cases were not profiled; the exit
    status is ncu's failure."""
    from kernelhub._cli.bench import kernel_counters

    page = (NCU_HEADER + "\n"
            '"0","7","kernelhub_grouped_matmul","GPU Speed Of Light Throughput","Duration",'
            '"usecond","612.5"\n')
    (tmp_path / "page.csv").write_text(page)
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "--log-file" ]; do shift; done\n'
        f'case "$2" in *deepseek-v3*) cp {tmp_path / "page.csv"} "$2"; echo "$*" > '
        f'{tmp_path / "args"}; exit 0;; esac\n'
        "exit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    out = tmp_path / "out"
    # As gpu_bench.sh runs it: ncu is to run this module again, by its importable name.
    done = subprocess.run([sys.executable, "-m", kernel_counters.__name__, "--shapes",
                           "qwen3-moe", "deepseek-v3", "--out", str(out)], env=dict(os.environ),
                          capture_output=True, text=True)
    assert done.returncode == 3, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["counters-deepseek-v3.csv", "counters.md"]
    assert (f"-m kernelhub._cli.bench.kernel_counters --target --out {out} --shapes deepseek-v3"
            in (tmp_path / "args").read_text())
    table = (out / "counters.md").read_text()
    # The scoreboard's order of shapes: DeepSeek-V3's rows first.
    assert ("| deepseek-v3: mosaic forward | ? | kernelhub_grouped_matmul | 612.5 usecond | - |"
            in table)
    assert "| deepseek-v3: triton forward | ? | not profiled |" in table
    assert "| qwen3-moe: mosaic forward | ? | not profiled |" in table
