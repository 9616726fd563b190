"""Tilings per pass, autotuning and tuning tables (kernelhub.tuning).

Results are checked against the float64 reference (tests/reference.py) under tilings other
than the heuristic's, on every implementation that runs here; the tables' behaviour (which
tiling a call gets, misses, files) is checked through what the kernels are asked.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernelhub
import reference
from conftest import assert_close, call, implementation_params, jitted_vjp
from kernelhub import tuning
from kernelhub.cli import main as cli_main
from kernelhub._grouped_matmul import active_table, tables as _table
from kernelhub.tuning import _autotune

M, K, N = 96, 48, 40
SIZES = np.array([0, 37, 5, 41, 7], np.int32)  # an empty group, unaligned sizes, sum 90 < 96
OFFSET = 1  # local groups 1..3 of 5
# The TuningSpace name of each implementation, wherever the suite runs it.
SPACES = {("xla", "any"): "xla", ("pallas", "cpu"): "pallas-interpret", ("pallas", "tpu"): "pallas",
          ("triton", "cpu"): "triton-interpret", ("triton", "gpu"): "triton",
          ("mosaic", "cpu"): "mosaic-interpret", ("mosaic", "gpu"): "mosaic"}


def _operands(seed: int = 0):
    rng = np.random.default_rng(seed)
    lhs = rng.standard_normal((M, K)).astype(np.float32)
    rhs = rng.standard_normal((3, K, N)).astype(np.float32)
    existing = rng.standard_normal((M, N)).astype(np.float32)
    d_out = rng.standard_normal((M, N)).astype(np.float32)
    return lhs, rhs, existing, d_out


def _gmm_vjp(gmm, lhs, rhs, existing, d_out):
    def forward(lhs, rhs, existing):
        return gmm(lhs, rhs, jnp.asarray(SIZES), group_offset=OFFSET, existing_out=existing)

    return jitted_vjp(forward, (lhs, rhs, existing), jnp.asarray(d_out))


def _assert_matches_reference(out, grads, lhs, rhs, existing, d_out):
    assert_close(out, reference.gmm(lhs, rhs, SIZES, OFFSET, existing), jnp.float32, contraction=K)
    expected = reference.gmm_vjp(lhs, rhs, SIZES, d_out, OFFSET, has_existing=True)
    for actual, wanted, contraction in zip(grads, expected, (N, M, 1)):
        assert_close(actual, wanted, jnp.float32, contraction=contraction)


# --- tilings per pass ------------------------------------------------------------------------


def test_each_pass_asks_its_own_tiling():
    """gmm's forward, lhs-gradient and rhs-gradient kernels each ask only their entry, with the
    dimensions of the kernel that pass runs (m, k, n as that kernel sees them)."""
    asked = {name: [] for name in tuning.PASSES}

    def recorder(name):
        def tiling(m, k, n):
            asked[name].append((m, k, n))
            return None
        return tiling

    lhs, rhs, existing, d_out = _operands()
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    per_pass = tuning.Tilings(**{name: recorder(name) for name in tuning.PASSES})
    out, pullback = jax.vjp(lambda a, b: gmm(a, b, jnp.asarray(SIZES), tiling=per_pass,
                                             group_offset=OFFSET), lhs, rhs)
    pullback(jnp.asarray(d_out))
    assert set(asked["forward"]) == {(M, K, N)}
    assert set(asked["lhs_gradient"]) == {(M, N, K)}  # d_out [m, n] times rhs^T
    assert set(asked["rhs_gradient"]) == {(M, K, N)}  # tgmm over the m rows


def test_tgmm_passes_ask_their_own_tiling():
    asked = {name: [] for name in tuning.PASSES}
    tilings = {name: (lambda m, k, n, name=name: asked[name].append((m, k, n))) for name in tuning.PASSES}
    rng = np.random.default_rng(1)
    lhs, rhs = rng.standard_normal((K, M), np.float32), rng.standard_normal((M, N), np.float32)
    tgmm = kernelhub.get("transposed_grouped_matmul", platform="xla")
    _, pullback = jax.vjp(lambda a, b: tgmm(a, b, jnp.asarray(SIZES), tiling=tilings), lhs, rhs)
    pullback(jnp.ones((len(SIZES), K, N), jnp.float32))
    assert set(asked["forward"]) == {(M, K, N)}
    assert set(asked["lhs_gradient"]) == {(M, N, K)}  # rhs [m, n] times d_out^T
    assert set(asked["rhs_gradient"]) == {(M, K, N)}  # lhs^T [m, k] times d_out


@pytest.mark.parametrize("spec", implementation_params("grouped_matmul"))
def test_per_pass_tilings_change_no_result(spec):
    """Each pass given a different legal tiling (one of its implementation's tuning
    candidates, not the heuristic's) still matches the float64 reference, edges included."""
    lhs, rhs, existing, d_out = _operands(2)
    recorder = _autotune.Recorder()
    with active_table.activated(recorder):  # traced only: the passes' calls, nothing compiled
        jax.eval_shape(lambda *a: _gmm_vjp(call(spec), *a), lhs, rhs, existing, d_out)
    per_pass = _non_default_tilings(recorder)
    out, grads = _gmm_vjp(lambda *a, **kw: call(spec)(*a, **kw, tiling=per_pass),
                          lhs, rhs, existing, d_out)
    _assert_matches_reference(out, grads, lhs, rhs, existing, d_out)


def _non_default_tilings(recorder) -> dict:
    """For each pass recorded, its implementation's last candidate tiling: never the default."""
    per_pass = {}
    for key, recorded in recorder.calls.items():
        default, *others = _autotune._candidates(recorded)
        assert others, f"{key.describe()} has no candidate besides its default {default}"
        per_pass[key.pass_name] = others[-1]
    assert set(per_pass) == set(tuning.PASSES)
    return per_pass


@pytest.mark.parametrize("spec", implementation_params("transposed_grouped_matmul"))
def test_tgmm_per_pass_tilings_change_no_result(spec):
    """tgmm and its gradients, each pass on a tiling other than its default: the float64
    reference's results with an offset, fewer actual groups than local ones, an empty group,
    unaligned sizes, sums below m and existing_out."""
    rng = np.random.default_rng(4)
    lhs, rhs = rng.standard_normal((K, M), np.float32), rng.standard_normal((M, N), np.float32)
    existing = rng.standard_normal((3, K, N)).astype(np.float32)
    d_out = rng.standard_normal((3, K, N)).astype(np.float32)
    tgmm = call(spec)

    def vjp(tiling):
        forward = lambda a, b, e: tgmm(a, b, jnp.asarray(SIZES), tiling=tiling,  # noqa: E731
                                       group_offset=OFFSET, num_actual_groups=3, existing_out=e)
        return jitted_vjp(forward, (lhs, rhs, existing), jnp.asarray(d_out))

    recorder = _autotune.Recorder()
    with active_table.activated(recorder):
        jax.eval_shape(lambda: vjp(None))
    out, grads = vjp(_non_default_tilings(recorder))
    assert_close(out, reference.tgmm(lhs, rhs, SIZES, OFFSET, 3, existing), jnp.float32,
                 contraction=M)
    expected = reference.tgmm_vjp(lhs, rhs, SIZES, d_out, OFFSET, has_existing=True)
    for actual, wanted, contraction in zip(grads, expected, (N, K, 1)):
        assert_close(actual, wanted, jnp.float32, contraction=contraction)


def test_bad_per_pass_tilings_name_the_pass():
    lhs, rhs, _, _ = _operands()
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    with pytest.raises(ValueError, match="unknown passes \\['backward'\\].*forward, lhs_gradient, rhs_gradient"):
        gmm(lhs, rhs, SIZES, tiling={"backward": (64, 64, 64)}, group_offset=OFFSET)
    with pytest.raises(ValueError, match="tiling\\['rhs_gradient'\\] must start with three positive"):
        gmm(lhs, rhs, SIZES, tiling={"rhs_gradient": (0, 64, 64)}, group_offset=OFFSET)
    with pytest.raises(TypeError, match="tiling\\['forward'\\] must be None, a callable"):
        gmm(lhs, rhs, SIZES, tiling=tuning.Tilings(forward="big"), group_offset=OFFSET)
    grad = jax.grad(lambda a: gmm(a, rhs, SIZES, tiling={"lhs_gradient": (48, 64, 64)},
                                  group_offset=OFFSET).sum())
    with pytest.raises(ValueError, match="tiling for the lhs_gradient pass: .*power of two"):
        grad(lhs)


# --- tables: lookups, misses, files -----------------------------------------------------------


def _forward_key(gmm, lhs, rhs) -> tuning.TuningKey:
    recorder = _autotune.Recorder()
    with active_table.activated(recorder):
        gmm(lhs, rhs, SIZES, group_offset=OFFSET)
    (key,) = recorder.calls
    return key


def _entry(tiling) -> tuning.Entry:
    return tuning.Entry(tuple(tiling), (512, K, N), 1.0, 1.0, "test")


def test_an_entry_serves_its_kernel_problem_in_every_op_and_pass():
    """One kernel runs in several ops and passes: gmm with the weights transposed is a gmm's
    lhs gradient and the forward of weights stored [G, n, k], tgmm a gmm's weight gradient and
    transposed_grouped_matmul's forward. An entry the tuner filed under the gradient gives its
    tiling (and its time) to the direct call of the same problem; an entry under the call's own
    key wins."""
    lhs, rhs, _, d_out = _operands()
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    tgmm = kernelhub.get("transposed_grouped_matmul", platform="xla")
    recorder = _autotune.Recorder()
    with active_table.activated(recorder):
        jax.vjp(lambda l, r: gmm(l, r, SIZES, group_offset=OFFSET), lhs, rhs)[1](d_out)
    gradients = {key.pass_name: key for key in recorder.calls if key.pass_name != "forward"}
    direct = {}
    for pass_name, make in (
            ("lhs_gradient", lambda: gmm(d_out, rhs, SIZES, group_offset=OFFSET,
                                         transpose_rhs=True)),
            ("rhs_gradient", lambda: tgmm(lhs.T, d_out, SIZES, group_offset=OFFSET,
                                          num_actual_groups=3))):
        recorder = _autotune.Recorder()
        with active_table.activated(recorder):
            make()
        ((key, call),) = recorder.calls.items()
        assert key.pass_name == "forward" and key.problem == gradients[pass_name].problem
        direct[pass_name] = key, call
    for pass_name, (key, call) in direct.items():
        tiling = _autotune_legal_tiling(call)
        table = tuning.Tuning({gradients[pass_name]: _entry(tiling)})
        assert table.lookup(key) == tiling, pass_name
        assert _table.measured_entry(table, call) is not None
        own = tuple(call.space.default(call.problem))
        assert tuning.Tuning({gradients[pass_name]: _entry(tiling),
                              key: _entry(own)}).lookup(key) == own
        assert tuning.Tuning({}).lookup(key) is None


def _autotune_legal_tiling(call) -> tuple[int, ...]:
    """A candidate of the call's tuning space other than its default."""
    default = tuple(call.space.default(call.problem))
    return next(tuple(c) for c in call.space.candidates(call.problem) if tuple(c) != default)


def test_active_table_is_used_when_traced_and_retraced_per_table():
    """A table's tiling reaches the kernel (an illegal one, refused, falls back to the
    heuristic with one warning), a call traced before the table is traced again under it, and
    a miss falls back to the heuristic."""
    lhs, rhs, _, _ = _operands()
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    expected = reference.gmm(lhs, rhs, SIZES, OFFSET)
    assert_close(gmm(lhs, rhs, SIZES, group_offset=OFFSET), expected, jnp.float32, contraction=K)
    key = _forward_key(gmm, lhs, rhs)
    assert key.pass_name == "forward"
    assert (key.problem.kernel, key.problem.m, key.problem.k, key.problem.n) == ("gmm", 128, 64, 64)
    illegal = tuning.Tuning({key: _entry((3, K, N))})
    with illegal, pytest.warns(UserWarning, match=r"tiling \[3, .* the heuristic"):
        assert_close(gmm(lhs, rhs, SIZES, group_offset=OFFSET), expected, jnp.float32,
                     contraction=K)
    other_shape = dataclasses.replace(key, problem=dataclasses.replace(key.problem, m=4096))
    with tuning.Tuning({other_shape: _entry((3, K, N))}):  # a miss: the heuristic, no tuning run
        assert_close(gmm(lhs, rhs, SIZES, group_offset=OFFSET), expected, jnp.float32, contraction=K)
    with tuning.Tuning({key: _entry((16, K, N))}):
        assert_close(gmm(lhs, rhs, SIZES, group_offset=OFFSET), expected, jnp.float32, contraction=K)
    # An explicit tiling for the pass wins over the table.
    with illegal:
        assert_close(gmm(lhs, rhs, SIZES, tiling=(64, K, N), group_offset=OFFSET), expected,
                     jnp.float32, contraction=K)


_ENV_SCRIPT = """
import sys
import numpy as np
import kernelhub
gmm = kernelhub.get("grouped_matmul", platform="xla")  # the table file is not read yet
lhs = np.ones((128, 64), np.float32); rhs = np.ones((3, 64, 64), np.float32)
sizes = np.array([0, 37, 5, 41, 7], np.int32)
try:
    gmm(lhs, rhs, sizes, group_offset=1)
except ValueError as error:
    print("ValueError:", error)
"""


def test_kernelhub_tuning_names_a_table_file(tmp_path):
    """KERNELHUB_TUNING=file is the table everywhere, read at the first lookup (not at import):
    its (illegal) tiling reaches the kernel, which refuses it with a warning naming the file; a
    file that is not a table, or no file, is one ValueError naming the variable and the path."""
    import subprocess
    import sys

    lhs, rhs, _, _ = _operands()
    key = _forward_key(kernelhub.get("grouped_matmul", platform="xla"), lhs, rhs)
    table, broken, binary = tmp_path / "tiles.json", tmp_path / "broken.json", tmp_path / "bin"
    tuning.Tuning({key: _entry((3, K, N))}).save(table)
    broken.write_text("not json")
    binary.write_bytes(bytes(range(256)))

    def run(path):
        env = dict(os.environ, KERNELHUB_TUNING=str(path), JAX_PLATFORMS="cpu")
        result = subprocess.run([sys.executable, "-c", _ENV_SCRIPT], env=env, text=True,
                                capture_output=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result

    refused = run(table)
    assert "ValueError" not in refused.stdout, refused.stdout
    assert f"{table}: tiling [3, " in refused.stderr, refused.stderr
    # An unusable file: the option holds its path as the variable set it above, so a call under
    # it here is what that process's call would be (a process each costs 4 s).
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    with active_table.activated(str(broken)):
        with pytest.raises(ValueError, match=f"KERNELHUB_TUNING={str(broken)!r} cannot be used"):
            gmm(lhs, rhs, SIZES, group_offset=OFFSET)
    for path in (binary, tmp_path / "missing.json", tmp_path):
        with pytest.raises(ValueError, match=f"KERNELHUB_TUNING={str(path)!r} cannot be used"):
            _table._from_file(str(path))


def test_a_miss_never_measures(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a lookup started a measurement")

    monkeypatch.setattr(_autotune, "compile_candidates", refuse)
    monkeypatch.setattr(_autotune, "time_candidates", refuse)
    lhs, rhs, _, _ = _operands()
    with tuning.Tuning():
        jax.grad(lambda a: kernelhub.grouped_matmul(a, rhs, SIZES, group_offset=OFFSET).sum())(lhs)


def test_shipped_table_is_used_without_a_context(monkeypatch):
    lhs, rhs, _, _ = _operands()
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    key = _forward_key(gmm, lhs, rhs)
    shipped = tuning.Tuning({key: _entry((3, K, N))}, "the shipped table")
    monkeypatch.setattr(_table, "shipped", lambda device: shipped)
    jax.clear_caches()  # shipped tables are fixed for a process: traces made before stay valid
    with pytest.warns(UserWarning, match="the shipped table: tiling"):  # it was consulted
        gmm(lhs, rhs, SIZES, group_offset=OFFSET)
    with tuning.heuristic():  # no table at all
        gmm(lhs, rhs, SIZES, group_offset=OFFSET)


def test_shipped_cpu_table_is_well_formed():
    shipped = tuning.shipped("cpu")
    assert len(shipped) > 0
    for key, entry in shipped.entries.items():
        assert key.device_kind == "cpu" and key.implementation == "xla"
        assert entry.tuned_ms <= entry.default_ms
        assert entry.tiling[0] & (entry.tiling[0] - 1) == 0  # xla: a power-of-two chunk


def _hopper_table_keys(device_kind: str) -> dict[str, set]:
    """The shipped table's (op, pass, problem) keys per implementation, each entry's tiling
    checked to be one its compiled kernel accepts."""
    from kernelhub._pallas.gpu import tuning_space as triton_space
    from kernelhub._pallas.mosaic_gpu import tuning_space as mosaic_space

    shipped = tuning.shipped(device_kind)
    spaces = {"triton": triton_space.space("triton"), "mosaic": mosaic_space.space("mosaic")}
    by_implementation: dict[str, set] = {}
    for key, entry in shipped.entries.items():
        assert key.device_kind == device_kind
        assert spaces[key.implementation].accepts(entry.tiling, key.problem)
        assert entry.tuned_ms > 0
        by_implementation.setdefault(key.implementation, set()).add(
            (key.op, key.pass_name, key.problem))
    return by_implementation


def test_shipped_h100_table_holds_both_hopper_kernels_at_the_moe_shapes():
    """nvidia-h100-80gb-hbm3.json: the scoreboard of 2026-11-28 (benchmarks/gpu/2026-11-28-h100/,
    gpu_scoreboard_table with its rows under the heuristic) at the four MoE shapes, both
    kernels at the same keys, each entry the tune's tiling only where it ran faster than the
    heuristic's there, both times recorded; the odd shape keeps the scoreboard's measured
    times of 2026-11-27 (a Mosaic tgmm key and the rest), where the Triton tgmm's rows, timed
    under its former heuristic, are left out."""
    by_implementation = _hopper_table_keys("NVIDIA H100 80GB HBM3")
    shipped = tuning.shipped("NVIDIA H100 80GB HBM3")
    assert all(entry.tuned_ms <= entry.default_ms for entry in shipped.entries.values())
    moe = {platform: {item for item in keys if item[2].num_groups != 7}
           for platform, keys in by_implementation.items()}
    assert moe["mosaic"] == moe["triton"]
    assert len(moe["triton"]) == 24  # 4 shapes x 2 ops x 3 passes
    for key, entry in shipped.entries.items():
        if key.problem.num_groups != 7:
            assert entry.groups.startswith("the scoreboard of 2026-11-28")
            assert dict(entry.candidates)[entry.default_tiling] == entry.default_ms
    odd = {platform: keys - moe[platform] for platform, keys in by_implementation.items()}
    assert not any(item[2].kernel.value == "tgmm" for item in odd["triton"])
    assert odd["mosaic"] - {item for item in odd["mosaic"] if item[2].kernel.value == "tgmm"} \
        == odd["triton"]


def test_shipped_h200_table_tunes_both_hopper_kernels_at_the_moe_shapes():
    """nvidia-h200.json (the tune of 2026-11-27, benchmarks/gpu/2026-11-27-h200/make_table.py):
    both kernels at the same keys, every pass of both ops at the four MoE shapes, each entry no
    slower than the heuristic's tiling, which the tuner timed beside it."""
    by_implementation = _hopper_table_keys("NVIDIA H200")
    assert all(entry.tuned_ms <= entry.default_ms
               for entry in tuning.shipped("NVIDIA H200").entries.values())
    assert by_implementation["mosaic"] == by_implementation["triton"]
    assert len(by_implementation["triton"]) == 24  # 4 shapes x 2 ops x 3 passes
    assert {problem.num_groups for _, _, problem in by_implementation["triton"]} == {8, 128, 256}


def test_table_round_trips_through_a_file(tmp_path):
    key = tuning.TuningKey("cpu", "xla", "grouped_matmul", "forward", tuning.KernelProblem(
        "gmm", 4096, 1024, 1024, 64, 64, "bfloat16", "bfloat16", "bfloat16", False))
    entry = tuning.Entry((256, 1024, 1024), (512, 1024, 1024), 10.5, 12.25, "balanced",
                         (((512, 1024, 1024), 12.25), ((256, 1024, 1024), 10.5),
                          ((2048, 1024, 1024), None)))
    path = tmp_path / "tiles.json"
    tuning.Tuning({key: entry}).save(path)
    loaded = tuning.load(path)
    assert loaded.entries == {key: entry}
    assert loaded.lookup(key) == (256, 1024, 1024)


def test_scale_blocks_round_trip_and_are_written_only_where_set(tmp_path):
    """A key's scale blocks (Problem.lhs_blocks, rhs_blocks) go to the file where set; an
    entry without them is written as before them, and such a file reads as tuned without
    blocks. A malformed value names the field."""
    plain = tuning.KernelProblem("gmm", 4096, 1024, 1024, 64, 64, "float8_e4m3fn",
                                 "float8_e4m3fn", "bfloat16", False)
    blocked = dataclasses.replace(plain, lhs_blocks="k128", rhs_blocks="k128")
    keys = [tuning.TuningKey("cpu", "xla", "grouped_matmul", "forward", problem)
            for problem in (plain, blocked)]
    path = tmp_path / "tiles.json"
    tuning.Tuning({key: _entry((64, 64, 64)) for key in keys}).save(path)
    document = json.loads(path.read_text())
    assert [("lhs_blocks" in item, item.get("rhs_blocks")) for item in document["entries"]] \
        == [(False, None), (True, "k128")]
    assert set(tuning.load(path).entries) == set(keys)
    document["entries"][1]["rhs_blocks"] = "x128"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="entry 1: rhs_blocks must be"):
        tuning.load(path)


def test_a_key_names_each_operands_scale_blocks_by_the_axis_in_that_pass():
    """fp8 in blocks of 16 along the contraction: the forward's keys say k16 for both
    operands; in the lhs gradient the weights' blocks run along its output columns (n16) and
    the cotangent has none; in the weight gradient the activations, transposed [k, m], have
    theirs along k (k16). One scale per row and column names no blocks."""
    lhs = jax.ShapeDtypeStruct((M, 64), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((3, 64, N), jnp.bfloat16)

    def blocks_by_pass(block_size):
        def loss(lhs, rhs):
            out = kernelhub.get("grouped_matmul", platform="xla")(
                kernelhub.quantize(lhs, jnp.float8_e4m3fn, axis=1, block_size=block_size),
                kernelhub.quantize(rhs, jnp.float8_e4m3fn, axis=1, block_size=block_size),
                jnp.asarray(SIZES[:3]), preferred_element_type=jnp.bfloat16)
            return jnp.sum(out.astype(jnp.float32))

        observer = _table.Observer(None)
        with active_table.activated(observer):
            jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)
        return {call.pass_name: (call.problem.lhs_blocks, call.problem.rhs_blocks)
                for call in observer.calls}

    assert blocks_by_pass(16) == {"forward": ("k16", "k16"), "lhs_gradient": ("", "n16"),
                                  "rhs_gradient": ("k16", "")}
    assert set(blocks_by_pass(None).values()) == {("", "")}


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a kernelhub tuning file: invalid JSON"),
    ('{"entries": []}', "not a kernelhub tuning file: it has no"),
    ('{"format": "kernelhub-tuning", "version": 99, "entries": []}', "version 99 is not supported"),
    ('{"format": "kernelhub-tuning", "version": 1, "entries": {}}', '"entries" must be a list'),
    ('{"format": "kernelhub-tuning", "version": 1, "entries": [{"op": "grouped_matmul"}]}',
     "entry 0 lacks device_kind"),
])
def test_bad_table_files_say_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as raised:
        tuning.load(path)
    assert str(path) in str(raised.value)


def test_bad_entries_name_the_field(tmp_path):
    key = tuning.TuningKey("cpu", "xla", "grouped_matmul", "forward", tuning.KernelProblem(
        "gmm", 128, 64, 64, 5, 3, "float32", "float32", "float32", True))
    path = tmp_path / "tiles.json"
    tuning.Tuning({key: _entry((64, 64, 64))}).save(path)
    document = json.loads(path.read_text())
    document["entries"][0]["tiling"] = [64, -1, 64]
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="entry 0: tiling must start with three positive block sizes"):
        tuning.load(path)
    document["entries"][0]["tiling"], document["entries"][0]["m"] = [64, 64, 64], "big"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match="entry 0: m must be int"):
        tuning.load(path)
    with pytest.raises(FileNotFoundError):
        tuning.load(tmp_path / "missing.json")


# --- autotune ----------------------------------------------------------------------------------


def _training_step(gmm):
    def step(lhs, rhs, existing, sizes):
        def loss(lhs, rhs):
            out = gmm(lhs, rhs, sizes, group_offset=OFFSET, existing_out=existing)
            return jnp.sum(out * out)
        return jax.grad(loss, argnums=(0, 1))(lhs, rhs)
    return step


def _forward(gmm):
    def forward(lhs, rhs, existing, sizes):
        return gmm(lhs, rhs, sizes, group_offset=OFFSET, existing_out=existing)
    return forward


@pytest.mark.parametrize("spec", implementation_params("grouped_matmul"))
def test_autotune_tunes_every_pass_and_its_result_matches_the_reference(spec, tmp_path, monkeypatch):
    """A training step tuned pass by pass, each result against the float64 reference. The
    tuner is the same for every implementation, only its tuning space differs: an interpreter
    tunes the forward pass alone (its candidates compile slowly here; every pass of each
    runs under a non-default tiling in test_per_pass_tilings_change_no_result)."""
    monkeypatch.chdir(tmp_path)  # autotune writes nothing: the directory stays empty
    lhs, rhs, existing, d_out = _operands(3)
    every_pass = not spec.interpret_only
    step = (_training_step if every_pass else _forward)(call(spec))
    tuned = kernelhub.autotune(step, lhs, rhs, existing, jax.ShapeDtypeStruct(SIZES.shape, jnp.int32),
                               repeats=1, draws=1, progress=False)
    assert list(tmp_path.iterdir()) == []
    assert {key.pass_name for key in tuned.entries} == (
        set(tuning.PASSES) if every_pass else {"forward"})
    for key, entry in tuned.entries.items():
        assert key.implementation == SPACES[(spec.platform.value, spec.backend.value)]
        assert entry.candidates[0][0] == entry.default_tiling
        assert entry.tuned_ms <= entry.default_ms
        assert entry.tiling in [tiling for tiling, ms in entry.candidates if ms is not None]
    with tuned:
        if every_pass:
            out, grads = _gmm_vjp(call(spec), lhs, rhs, existing, d_out)
            _assert_matches_reference(out, grads, lhs, rhs, existing, d_out)
        else:
            out = jax.jit(_forward(call(spec)))(lhs, rhs, existing, jnp.asarray(SIZES))
            assert_close(out, reference.gmm(lhs, rhs, SIZES, OFFSET, existing), jnp.float32,
                         contraction=K)


@pytest.mark.parametrize("second_timing, expected_winner", [((10.0, 6.0), True),
                                                            ((10.0, 9.9), False)])
def test_a_leader_must_win_again_on_fresh_operands(monkeypatch, second_timing, expected_winner):
    """The fastest of many noisy timings is flattered by its noise: a leader replaces the
    default only when a second timing of the two, on fresh operands, confirms it."""
    rounds = []

    def scripted(executables, arrays, repeats, advance, calls_per_sample=1):
        rounds.append(len(executables))
        if len(rounds) == 1:  # the first round: the second candidate leads by far
            return [10.0, 5.0] + [20.0] * (len(executables) - 2)
        return list(second_timing)

    monkeypatch.setattr(_autotune, "time_candidates", scripted)
    lhs, rhs, _, _ = _operands()
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    tuned = kernelhub.autotune(lambda a, b: gmm(a, b, SIZES), lhs, rhs, progress=False)
    (entry,) = tuned.entries.values()
    assert rounds[1] == 2  # the default and the leader, once more
    leader = entry.candidates[1][0]
    assert entry.tiling == (leader if expected_winner else entry.default_tiling)
    assert (entry.default_ms, entry.tuned_ms) == (
        second_timing if expected_winner else (second_timing[0],) * 2)


def test_candidates_lowering_to_one_program_are_compiled_and_timed_once():
    """A kernel that cuts two tilings to the same blocks (the Mosaic GPU kernels do, for scale
    blocks) lowers them to one program: the tuner compiles it once, times it once a turn and
    gives both candidates its time; a third tiling, another program, keeps its own."""
    from kernelhub._grouped_matmul.passes import KernelCall, TuningSpace

    def invoke(arrays, tiling):
        return arrays[0] * (2.0 if tiling[0] < 3 else 3.0)  # tilings 1 and 2 run alike

    problem = tuning.KernelProblem("gmm", 8, 8, 8, 1, 1, "float32", "float32", "float32",
                                   False)
    kernel_call = KernelCall(TuningSpace("cut", lambda p: [], lambda p: (1,)), "grouped_matmul",
                             "forward", problem, (jnp.ones((8, 8)), None, None, None, None),
                             invoke)
    example = (jnp.ones((8, 8)), None, None, None, None)
    executables = _autotune.compile_candidates(kernel_call, [(1,), (2,), (3,)], example,
                                               advance=lambda: None)
    assert executables[0] is executables[1] and executables[2] is not executables[0]
    ran = []

    def counted(executable):
        def run(arrays):
            ran.append(executable)
            return executable(arrays)
        return run

    shared, other = counted(executables[0]), counted(executables[2])
    times = _autotune.time_candidates([shared, shared, other], [example], repeats=2,
                                      advance=lambda: None)
    assert times[0] == times[1] and times[2] is not None
    assert ran.count(executables[0]) == ran.count(executables[2]) == 2 * 2  # untimed + timed


def test_candidates_take_each_place_in_a_turn(monkeypatch):
    """The heuristic's tiling is candidate 0: timed first in every turn, or always after the
    same candidate, a cost of that place would flatter every other candidate, the
    confirmation's leader too. Each turn starts one candidate further on, and each sample comes
    after an untimed call of its own executable, so identical executables get one time."""
    import types

    state = {"now": 0.0, "place": 0, "calls": []}

    def executable(name):
        def run(operand_set):
            state["now"] += 1.0 + (10.0 if state["place"] == 0 else 0.0)
            state["place"] += 1
            state["calls"].append(name)
            return jnp.zeros(())
        return run

    def advance():
        state["place"] = 0  # a new turn

    from kernelhub._core import turns

    monkeypatch.setattr(turns, "time", types.SimpleNamespace(
        perf_counter=lambda: state["now"]))
    times = _autotune.time_candidates([executable(0), None, executable(2), executable(3)],
                                      [(), ()], repeats=3, advance=advance)
    assert times == [1e3, None, 1e3, 1e3]
    calls = state["calls"]  # per turn: 3 executables, each once untimed and twice timed
    assert [calls[turn * 9] for turn in range(3)] == [0, 2, 3]
    assert calls[:9] == [0, 0, 0, 2, 2, 2, 3, 3, 3]
    # Back to back: 3 calls per draw in a sample, waited for once, timed per call.
    waits = []
    real_wait = jax.block_until_ready
    monkeypatch.setattr(_autotune.jax, "block_until_ready",
                        lambda value: (waits.append(len(state["calls"])), real_wait(value))[1])
    state["calls"].clear()
    times = _autotune.time_candidates([executable(0)], [(), ()], repeats=1, advance=advance,
                                      calls_per_sample=3)
    assert len(state["calls"]) == 1 + 2 * 3 and waits == [1, 7]
    assert times == [1e3]


def test_autotune_group_sizes_and_errors():
    lhs, rhs, existing, _ = _operands()
    # The forward pass alone: the caller's sizes reach every pass alike.
    step = _forward(kernelhub.get("grouped_matmul", platform="xla"))
    sizes = jax.ShapeDtypeStruct(SIZES.shape, jnp.int32)
    tuned = kernelhub.autotune(step, lhs, rhs, existing, sizes, group_sizes=SIZES, repeats=1,
                               progress=False)
    assert all(entry.groups == "the caller's (1 vectors)" for entry in tuned.entries.values())
    with pytest.raises(ValueError, match="group_sizes\\[0\\] must hold 5 sizes"):
        kernelhub.autotune(step, lhs, rhs, existing, sizes, group_sizes=SIZES[:3], progress=False)
    with pytest.raises(ValueError, match="skew must be >= 0"):
        kernelhub.autotune(step, lhs, rhs, existing, sizes, skew=-1.0, progress=False)
    with pytest.raises(ValueError, match="calls_per_sample must be an int >= 1, got 0"):
        kernelhub.autotune(step, lhs, rhs, existing, sizes, calls_per_sample=0, progress=False)
    with pytest.raises(ValueError, match="calls_per_sample must be an int >= 1, got True"):
        kernelhub.autotune(step, lhs, rhs, existing, sizes, calls_per_sample=True,
                           progress=False)
    assert _autotune.default_calls_per_sample() == 1  # on this CPU
    with pytest.raises(ValueError, match="made no kernelhub grouped-matmul call"):
        kernelhub.autotune(lambda x: x * 2, lhs, progress=False)
    explicit = _forward(lambda *a, **kw: kernelhub.grouped_matmul(*a, **kw, tiling=(64, 64, 64)))
    with pytest.raises(ValueError, match="made no kernelhub grouped-matmul call"):
        kernelhub.autotune(explicit, lhs, rhs, existing, sizes, progress=False)


def test_the_weight_gradient_is_timed_from_the_activations_it_transposes():
    """The rhs_gradient's tgmm takes x.T in a backward: the tuner makes x [m, k] and transposes
    it inside the timed call (a kernel reading x as it is pays no copy there, as in training);
    the other passes get their operands as the kernel takes them."""
    gmm = kernelhub.get("grouped_matmul", platform="xla")
    lhs = jax.ShapeDtypeStruct((40, 8), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((3, 8, 6), jnp.bfloat16)
    sizes = jnp.array([10, 20, 10], jnp.int32)

    def loss(lhs, rhs):
        return gmm(lhs, rhs, sizes, preferred_element_type=jnp.bfloat16).astype(jnp.float32).sum()

    recorder = _autotune.Recorder()
    with active_table.activated(recorder):
        jax.eval_shape(jax.grad(loss, argnums=(0, 1)), lhs, rhs)
    by_pass = {key.pass_name: recorded for key, recorded in recorder.calls.items()}
    weight = by_pass["rhs_gradient"]
    made = _autotune.operands(weight, np.array([10, 20, 10], np.int32), 0)
    assert made[0].shape == (40, 8)  # x
    called = _autotune.as_called(weight, made)
    assert called[0].shape == (8, 40)
    np.testing.assert_array_equal(np.asarray(called[0]), np.asarray(made[0]).T)
    forward = by_pass["forward"]
    made = _autotune.operands(forward, np.array([10, 20, 10], np.int32), 0)
    assert _autotune.as_called(forward, made)[0] is made[0]


def test_group_size_draws():
    problem = tuning.KernelProblem("gmm", 1000, 8, 8, 10, 10, "float32", "float32", "float32", False)
    (balanced,), described = _autotune.group_size_draws(problem, None, 0.0, 3, 0)
    assert described == "balanced" and balanced.sum() == 1000 and balanced.max() - balanced.min() <= 1
    skewed, described = _autotune.group_size_draws(problem, None, 2.0, 3, 0)
    assert len(skewed) == 3 and all(s.sum() == 1000 and s.shape == (10,) for s in skewed)
    assert "Dirichlet skew 2" in described
    assert max(s.max() for s in skewed) > 2 * 100  # skewed: some group well above the mean


# --- the xla implementation's knobs ------------------------------------------------------------


# Each head and each chunk once, not every pair: a head of more rows than a chunk (64 > 16)
# and none at all beside the small chunk, the heads within a chunk beside the large one.
@pytest.mark.parametrize("largest, head_rows", [(16, 0), (16, 64), (512, 8), (512, 16)])
def test_xla_tgmm_head_rows_and_chunks_change_no_result(head_rows, largest):
    """tgmm's batched head (tiling[3]) and largest chunk (tiling[0]) on the XLA loop: whatever
    their values, the float64 reference's result, with an offset, an empty group, unaligned
    sizes, sums below m and existing_out."""
    rng = np.random.default_rng(4)
    lhs, rhs = rng.standard_normal((K, M), np.float32), rng.standard_normal((M, N), np.float32)
    existing = rng.standard_normal((3, K, N)).astype(np.float32)
    tgmm = kernelhub.get("transposed_grouped_matmul", platform="xla")
    out = tgmm(lhs, rhs, SIZES, tiling=(largest, K, N, head_rows), group_offset=OFFSET,
               num_actual_groups=3, existing_out=existing)
    expected = reference.tgmm(lhs, rhs, SIZES, OFFSET, 3, existing)
    assert_close(out, expected, jnp.float32, contraction=M)


def test_xla_head_rows_must_be_zero_or_a_power_of_two():
    rng = np.random.default_rng(5)
    lhs, rhs = rng.standard_normal((K, M), np.float32), rng.standard_normal((M, N), np.float32)
    tgmm = kernelhub.get("transposed_grouped_matmul", platform="xla")
    with pytest.raises(ValueError, match="head_rows, the rows per group the batched head sums, "
                                         "must be 0 \\(no head\\) or a power of two"):
        tgmm(lhs, rhs, SIZES, tiling=(64, K, N, 24))
    with pytest.raises(ValueError, match="any further entries >= 0"):
        tgmm(lhs, rhs, SIZES, tiling=(64, K, N, -1))


def test_xla_tgmm_candidates_vary_each_knob():
    problem = tuning.KernelProblem("tgmm", 4096, 1024, 1024, 64, 64, "bfloat16", "bfloat16",
                                   "float32", False)
    space = kernelhub._xla.tuning_space.SPACE
    default = space.default(problem)
    assert default == (512, 1024, 1024, 64)  # the heuristic's chunk and the even share
    candidates = space.candidates(problem)
    assert {c[3] for c in candidates} == {0, 8, 16, 32, 64, 128}
    assert {c[0] for c in candidates} == {64, 128, 256, 512, 1024, 2048}
    assert all(c[0] == 512 or c[3] == 64 for c in candidates)  # a cross around the default


def test_triton_candidates_are_legal_and_give_eight_bit_tiles_deeper_blocks():
    from kernelhub._pallas.gpu import config, tuning_space

    space = tuning_space.space("triton")
    # gmm sums over block_k (index 1), tgmm over block_m (index 0)
    for kernel, contraction, out_rows in (("gmm", 1, 0), ("tgmm", 0, 1)):
        deepest = {}
        for dtype in ("bfloat16", "float32", "int8", "float8_e4m3fn"):
            problem = tuning.KernelProblem(kernel, 8192, 4096, 2048, 64, 64, dtype, dtype,
                                           "bfloat16", False)
            candidates = space.candidates(problem)
            assert len(candidates) == len(set(candidates)) > 0
            for tiling in candidates:
                config.validate(config.BlockConfig(*tiling), tiling)
            deepest[dtype] = max(tiling[contraction] for tiling in candidates)
            if dtype in ("int8", "float8_e4m3fn"):
                doubled = [t for t in candidates if t[contraction] > deepest["bfloat16"]]
                assert doubled and all(t[3] == 8 for t in doubled if t[out_rows] >= 128)
        assert deepest["float32"] * 2 == deepest["bfloat16"]
        assert deepest["int8"] == deepest["float8_e4m3fn"] == 2 * deepest["bfloat16"]
    mixed = tuning.KernelProblem("gmm", 8192, 4096, 2048, 64, 64, "bfloat16", "int8",
                                 "bfloat16", False)  # weight-only int8 widens: bf16's candidates
    bf16 = dataclasses.replace(mixed, rhs_dtype="bfloat16")
    assert space.candidates(mixed) == space.candidates(bf16)


# --- group sizes the tuner times ---------------------------------------------------------------


def test_several_skews_are_timed_together():
    problem = tuning.KernelProblem("gmm", 1000, 8, 8, 10, 10, "float32", "float32", "float32", False)
    vectors, described = _autotune.group_size_draws(problem, None, (0, 2.0), 3, 0)
    assert described == "balanced + Dirichlet skew 2 (3 draws)"
    assert len(vectors) == 4 and vectors[0].max() - vectors[0].min() <= 1
    assert all(v.sum() == 1000 for v in vectors)


def test_the_tuner_never_draws_the_benchmarks_sizes():
    """kernelhub bench --tuning times the benchmark's skewed draw; the tuner's draws come from
    a stream of their own, so a table cannot have been tuned on exactly those sizes."""
    from kernelhub._cli._group_sizes import group_sizes

    for groups in (8, 64, 256):
        problem = tuning.KernelProblem("gmm", 4096, 8, 8, groups, groups, "float32", "float32",
                                       "float32", False)
        drawn, _ = _autotune.group_size_draws(problem, None, 2.0, 4, 0)
        benchmark = group_sizes(4096, groups, "skewed")
        assert not any(np.array_equal(vector, benchmark) for vector in drawn)


# --- the benchmark and the command -------------------------------------------------------------


def test_tuning_bench_times_both_steps_against_the_heuristic():
    from kernelhub._cli.bench import tuning as bench_tuning

    # A table with an entry for each pass the bench's training step makes (by hand: the tune
    # command has tests of its own), the forward's set to a tiling the heuristic never picks:
    # the bench must report it.
    step = bench_tuning._step("transposed_grouped_matmul", jnp.float32, "xla",
                              with_gradients=True)
    calls = bench_tuning._kernel_calls(step, bench_tuning._abstract_operands(
        "transposed_grouped_matmul", 64, 32, 32, 4, jnp.float32))
    assert {key.pass_name for key in calls} == set(tuning.PASSES)
    entries = {key: tuning.Entry(*(tuple(call.space.default(call.problem)),) * 2, 1.0, 1.0,
                                 "test") for key, call in calls.items()}
    key, entry = next((key, entry) for key, entry in entries.items()
                      if key.pass_name == "forward")
    changed_tiling = (16, *entry.default_tiling[1:])
    table = tuning.Tuning({**entries, key: dataclasses.replace(entry, tiling=changed_tiling)})
    rows = bench_tuning.measure("transposed_grouped_matmul", 64, 32, 32, 4, "float32", "skewed",
                                table, reps=1, draws=1, platform="xla")
    assert [row[4] for row in rows] == list(bench_tuning.STEPS)
    assert all(len(row) == len(bench_tuning.COLUMNS) and float(row[5]) > 0 for row in rows)
    assert rows[0][8].split(", ")[0] == f"forward {'x'.join(map(str, changed_tiling))}"


def test_tune_command_takes_several_problems_and_sharded_experts(tmp_path, monkeypatch, capsys):
    """Both ops at two group counts and two skews in one run, the experts sharded. With
    --output the table is written after every kernel (merged into what the file held): a run
    stopped from outside keeps the kernels it finished."""
    output = tmp_path / "tiles.json"
    lhs, rhs, _, _ = _operands()
    key = _forward_key(kernelhub.get("grouped_matmul", platform="xla"), lhs, rhs)
    earlier_key = dataclasses.replace(key, device_kind="an earlier run's device")
    tuning.Tuning({earlier_key: _entry((16, K, N))}).save(output)
    sizes_saved = []
    original = tuning.Tuning.save

    def counting(self, path):
        sizes_saved.append(len(self.entries))
        return original(self, path)

    monkeypatch.setattr(tuning.Tuning, "save", counting)
    code = cli_main(["tune", "--shape", "64x32x32", "--groups", "4", "8", "--local-groups", "2",
                     "--dtypes", "f32", "--ops", "gmm", "tgmm", "--skew", "0", "2",
                     "--forward-only", "--repeats", "1", "--draws", "1", "--time-limit", "600",
                     "--output", str(output)])
    assert code == 0
    assert sizes_saved == [2, 3, 4, 5, 5]  # the earlier entry, then one kernel more each time
    tuned = dict(tuning.load(output).entries)
    assert tuned.pop(earlier_key) == _entry((16, K, N))
    assert {entry.groups for entry in tuned.values()} == {
        "balanced + Dirichlet skew 2 (1 draws)"}
    assert {(key.problem.kernel, key.problem.num_groups, key.problem.local_groups)
            for key in tuned} == {
        ("gmm", 4, 2), ("gmm", 8, 2), ("tgmm", 4, 2), ("tgmm", 8, 2)}
    with pytest.raises(SystemExit):
        cli_main(["tune", "--groups", "4", "--local-groups", "8", "--shape", "64x32x32"])


def test_tune_command_keys_the_result_dtype(tmp_path, capsys):
    """A call's preferred_element_type is part of its key: bf16 operands tuned for a float32
    result (the ops' default) and for a bf16 one are two entries, and a call finds its own."""
    output = tmp_path / "tiles.json"
    code = cli_main(["tune", "--shape", "64x32x32", "--groups", "4", "--dtypes", "bf16",
                     "--out-dtypes", "bf16", "f32", "--forward-only", "--repeats", "1",
                     "--draws", "1", "--output", str(output)])
    assert code == 0
    assert "bfloat16 -> float32" in capsys.readouterr().out
    saved = tuning.load(output)
    assert sorted(key.problem.out_dtype for key in saved.entries) == ["bfloat16", "float32"]


def test_a_time_limit_stops_between_kernels_and_reports_each_entry_as_decided(monkeypatch):
    """A kernel is not started when the longest so far would end past time_limit: the entries
    decided before stay, each handed to on_entry as it is decided, and a warning names the
    kernels left untuned."""
    ticks = iter(range(0, 1000, 10))  # every reading of the clock is 10 s after the last
    monkeypatch.setattr(_autotune, "_clock", lambda: next(ticks))
    lhs, rhs, existing, _ = _operands()
    step = _training_step(kernelhub.get("grouped_matmul", platform="xla"))
    sizes = jax.ShapeDtypeStruct(SIZES.shape, jnp.int32)
    decided = []
    with pytest.warns(UserWarning, match="time_limit of 25s reached") as caught:
        tuned = kernelhub.autotune(step, lhs, rhs, existing, sizes, repeats=1, draws=1,
                                   progress=False, time_limit=25,
                                   on_entry=lambda key, entry: decided.append((key, entry)))
    # started at 0; the first kernel from 10 to 20; the second would start at 30 and take 10
    (key,) = tuned.entries
    assert decided == [(key, tuned.entries[key])]
    untuned = {p for p in tuning.PASSES if p != key.pass_name}
    # (Other warnings may come too: the test run's shared XLA cache warns of an entry read while
    # another process writes it.)
    message = next(str(w.message) for w in caught if "time_limit" in str(w.message))
    assert all(f"grouped_matmul {p} " in message for p in untuned)
    with pytest.raises(ValueError, match="time_limit must be a number of seconds > 0"):
        kernelhub.autotune(step, lhs, rhs, existing, sizes, progress=False, time_limit=0)


@pytest.mark.parametrize("dtype, low, high", [(jnp.int8, -127, 127), (jnp.int4, -8, 7),
                                              (jnp.bfloat16, None, None),
                                              (jnp.float8_e4m3fn, None, None)])
def test_operands_are_made_on_the_device_in_their_dtype(dtype, low, high):
    """The tuner's operands are drawn by jax.random where they run (drawn on the host, the
    weights of DeepSeek-V3's local experts took 10 s a draw): integers within the dtype's range
    up to +-127, floats standard normal."""
    values = _autotune.random_array(jax.random.key(0), (64, 256), jnp.dtype(dtype))
    assert values.dtype == jnp.dtype(dtype) and values.shape == (64, 256)
    wide = np.asarray(values.astype(jnp.float32))
    if low is not None:
        assert wide.min() >= low and wide.max() <= high and len(np.unique(wide)) > 10
    else:
        assert abs(wide.mean()) < 0.1 and 0.8 < wide.std() < 1.2
    again = _autotune.random_array(jax.random.key(0), (64, 256), jnp.dtype(dtype))
    np.testing.assert_array_equal(np.asarray(again.astype(jnp.float32)), wide)


def test_tune_command_prints_saves_and_tunes_quantized_operands(tmp_path, capsys):
    """The command tunes every pass, prints each and saves the table. --dtypes fp8 (or e5m2,
    int8): the step quantizes both bf16 operands along their contraction in the call, so the
    kernels tuned are the quantized ones (keyed by the stored values' dtype), the forward's
    result bf16; the gradients' kernels take the cotangent beside the quantized operand."""
    output, stored = tmp_path / "tiles.json", "float8_e4m3fn"
    assert cli_main(["tune", "--shape", "64x32x32", "--groups", "4", "--dtypes", "fp8",
                     "--platform", "xla", "--repeats", "1", "--draws", "1",
                     "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "winner" in printed and "lhs_gradient" in printed and "tuned vs default" in printed
    assert os.path.getsize(output) > 0
    by_pass = {key.pass_name: key.problem for key in tuning.load(output).entries}
    assert set(by_pass) == set(tuning.PASSES)
    forward = by_pass["forward"]
    assert (forward.lhs_dtype, forward.rhs_dtype, forward.out_dtype) == (stored, stored,
                                                                         "bfloat16")
    assert by_pass["lhs_gradient"].rhs_dtype == stored
    with pytest.raises(SystemExit):
        cli_main(["tune", "--dtypes", "fp4", "--shape", "64x32x32"])


def test_tune_command_tunes_scale_blocks_under_their_key(tmp_path, capsys):
    """--scale-block 16: the step quantizes in blocks of 16 along the contraction, and the
    table's key and the printed table name them; refused for a float --dtypes."""
    output = tmp_path / "tiles.json"
    assert cli_main(["tune", "--shape", "64x32x32", "--groups", "4", "--dtypes", "int8",
                     "--scale-block", "16", "--forward-only", "--platform", "xla",
                     "--repeats", "1", "--draws", "1", "--output", str(output)]) == 0
    (key,) = tuning.load(output).entries
    assert (key.problem.lhs_blocks, key.problem.rhs_blocks) == ("k16", "k16")
    assert "int8/k16" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["tune", "--shape", "64x32x32", "--dtypes", "bf16", "--scale-block", "16"])
    assert "--scale-block blocks the scales of a quantized --dtypes" in capsys.readouterr().err


def test_tune_command_tunes_weight_only_quantization(tmp_path, capsys):
    """--weights-only: bf16 activations beside int8 weights quantized in the call, keyed by
    both dtypes, and shown so; refused where there are no weights to quantize."""
    output = tmp_path / "tiles.json"
    assert cli_main(["tune", "--shape", "64x32x32", "--groups", "4", "--dtypes", "int8",
                     "--weights-only", "--forward-only", "--platform", "xla", "--repeats", "1",
                     "--draws", "1", "--output", str(output)]) == 0
    (key,) = tuning.load(output).entries
    assert (key.problem.lhs_dtype, key.problem.rhs_dtype) == ("bfloat16", "int8")
    assert "bfloat16 x int8" in capsys.readouterr().out
    for wrong in (["--dtypes", "bf16"], ["--dtypes", "int8", "--ops", "tgmm"]):
        with pytest.raises(SystemExit):
            cli_main(["tune", "--shape", "64x32x32", "--weights-only", *wrong])
        assert "--weights-only quantizes grouped_matmul's" in capsys.readouterr().err
