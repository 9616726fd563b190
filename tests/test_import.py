"""Importing kernelhub loads nothing; its first use registers the implementations and does
nothing else (no jax backend, no TPU runtime, no environment read before a call)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_loads_nothing_and_first_use_initialises_no_backend():
    out = _run("""
        import os, sys
        os.environ["KERNELHUB_PLATFORM"] = "not-a-platform"  # read when first used, not at import
        import kernelhub
        assert "jax" not in sys.modules, "importing kernelhub imported jax"
        count = len(kernelhub.implementations("grouped_matmul"))  # first use: registers
        from jax._src import xla_bridge
        assert not xla_bridge._backends, "a jax backend was initialised by loading kernelhub"
        assert "libtpu" not in sys.modules, "the TPU runtime was imported"
        assert kernelhub.parallel.route and kernelhub.testing.check_implementations
        print(count)
    """)
    assert int(out.strip().splitlines()[-1]) >= 1


def test_submodules_alone_still_see_the_built_in_ops():
    out = _run("""
        from kernelhub import testing
        print(len(testing.runnable_implementations("ragged_dot")))
    """)
    assert int(out.strip().splitlines()[-1]) >= 1


def test_the_command_answers_help_without_loading_jax():
    out = _run("""
        import sys
        from kernelhub import cli
        try:
            cli.main(["--help"])
        except SystemExit:
            pass
        print("jax" in sys.modules)
    """)
    assert out.strip().splitlines()[-1] == "False"
