"""The `kernelhub` command's promises: whole op names at a narrow width, the user's own ops with
--import, the library's names for platforms and backends, tune --quick, and a tuning bench at
the user's shape that says up front what its table cannot answer.

The commands run in this process through `main(argv)`; only the import of a user's module that
declares an op runs in a subprocess, so that its op stays out of this process's registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import kernelhub
from kernelhub._cli import _arguments
from kernelhub.cli import main


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `kernelhub ARGV`; argparse's exits included."""
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("columns", ["80", "100"])
def test_list_shows_every_op_name_whole(columns, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = _run(["list"], capsys)
    assert code == 0
    assert max(map(len, out.splitlines())) <= int(columns)
    first_cells = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(kernelhub.op_names()) <= first_cells
    assert "…" not in out  # rich's mark of a cut cell


def test_list_reads_platform_and_backend_as_the_library_does(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = _run(["list", "--op", "grouped_matmul", "--backend", " CUDA "], capsys)
    rows = [line.split() for line in out.splitlines() if line.startswith("grouped_matmul")]
    assert code == 0 and rows and all(row[2] == "gpu" for row in rows)
    assert {row[1] for row in rows} == {"triton", "mosaic"}
    code, out, _ = _run(["list", "--op", "grouped_matmul", "--platform", "XLA"], capsys)
    rows = [line.split() for line in out.splitlines() if line.startswith("grouped_matmul")]
    assert code == 0 and rows and all(row[1] == "xla" for row in rows)
    assert _arguments.platform(" Triton ") == "triton" and _arguments.backend("rocm") == "gpu"


def test_a_backend_given_as_platform_is_named_in_the_librarys_words(capsys):
    code, _, err = _run(["tune", "--platform", "gpu"], capsys)
    assert code == 2
    assert "--platform='gpu' is not one of: pallas, triton, mosaic, xla" in err
    assert "names hardware (a backend)" in err


def test_list_imports_the_users_module_and_shows_its_op(tmp_path):
    (tmp_path / "team_ops.py").write_text(textwrap.dedent('''
        from jaxtyping import Array, Float
        import kernelhub

        @kernelhub.define_op
        def doubled_rows_of_the_team(x: Float[Array, "rows cols"]) -> Float[Array, "rows cols"]:
            """Twice x."""

        @kernelhub.register(doubled_rows_of_the_team, "xla", "any")
        def _doubled(x):
            return 2 * x
    '''))
    environment = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "80",
                   "JAX_PLATFORMS": "cpu"}
    listed = subprocess.run([sys.executable, "-m", "kernelhub.cli", "list", "--import",
                             "team_ops"], capture_output=True, text=True, env=environment,
                            cwd=tmp_path.parent, timeout=120)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "doubled_rows_of_the_team" in line)
    assert row.split()[:4] == ["doubled_rows_of_the_team", "xla", "any", "0"]


def test_a_module_that_fails_to_import_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "failing_team_ops.py").write_text(
        "import kernelhub\n\nraise RuntimeError('no config found\\nsecond line')\n")
    code, out, err = _run(["list", "--import", "failing_team_ops"], capsys)
    assert code == 2 and not out
    assert err.splitlines() == [
        f"kernelhub list: error: --import failing_team_ops failed: RuntimeError: no config "
        f"found (at {tmp_path / 'failing_team_ops.py'}:3)"]
    code, _, err = _run(["bench", "--import", "no_such_team_module"], capsys)
    assert code == 2
    assert err.splitlines() == ["kernelhub bench: error: --import no_such_team_module failed: "
                                "ModuleNotFoundError: No module named 'no_such_team_module'"]
    code, _, err = _run(["tune", "--import", "team_ops.py"], capsys)
    assert code == 2 and "give a module name such as mypkg.ops, not a file" in err


def test_bench_options_that_another_benchmark_reads_are_errors(capsys):
    code, _, err = _run(["bench", "--ragged", "--shape", "64x32x32"], capsys)
    assert code == 2
    assert err.strip() == ("kernelhub bench: error: --shape is read by the CPU benchmark (no "
                           "flag) and --tuning only, not by --ragged")
    code, _, err = _run(["bench", "--shape", "64x32"], capsys)
    assert code == 2 and "shape must be M x K x N such as 4096x1024x1024, got '64x32'" in err


def test_quick_tune_then_a_tuning_bench_at_its_shape(tmp_path, monkeypatch, capsys):
    from kernelhub._cli.bench import tuning as bench_tuning

    monkeypatch.setenv("COLUMNS", "400")  # the header names tmp_path: keep it on one line
    # The bench's balanced sizes only: each pattern is a row of the same code (five
    # compilations), and tests/test_tuning.py's bench times the skewed ones.
    monkeypatch.setattr(bench_tuning, "PATTERNS", ("balanced",))
    table = tmp_path / "tiles.json"
    # gmm: its forward has the fewest tuning candidates here (a compilation each), 2 to tgmm's 5
    # (tests/test_tuning.py benches tgmm).
    code, out, _ = _run(["tune", "--quick", "--shape", "64x32x32", "--groups", "4", "--dtypes",
                         "f32", "--ops", "gmm", "--forward-only", "--output", str(table)],
                        capsys)
    assert code == 0 and table.exists()
    assert "kernelhub tune --quick" in out and "median of 3 turns" in out

    # At the bench's own shape the table answers nothing: said before any timing, in one line.
    code, out, err = _run(["bench", "--tuning", "--tuning-table", str(table), "--ops", "gmm",
                           "--dtypes", "f32", "--groups", "4"], capsys)
    assert code == 2 and not out
    assert len(err.splitlines()) == 1
    assert "has no entry for the calls this bench would time (gmm 4096x1024x1024" in err
    assert "it holds gmm 64x32x32, 4 groups, float32 -> float32 on cpu" in err

    # At its shape it times the case the table holds, and names the one it skips up front.
    code, out, _ = _run(["bench", "--tuning", "--tuning-table", str(table), "--shape",
                         "64x32x32", "--groups", "4", "8", "--ops", "gmm", "--dtypes", "f32",
                         "--reps", "1", "--draws", "1"], capsys)
    assert code == 0
    skipped = out.splitlines()[0]
    assert skipped.startswith(f"skipped, as {table} has no entry for them")
    assert skipped.endswith("itself): gmm 64x32x32, 8 groups, float32 -> float32")
    assert "64x32x32, float32 results (the ops' default), tuned:" in out
    rows = [line for line in out.splitlines() if line.startswith("│ gmm")]
    assert len(rows) == 2 and all("│ 4 " in row and "balanced" in row for row in rows)  # 2 steps
