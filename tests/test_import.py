"""Importing kernelhub registers implementations and does nothing else."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_initialises_no_backend_and_reads_no_environment():
    code = textwrap.dedent("""
        import os, sys
        os.environ["KERNELHUB_PLATFORM"] = "not-a-platform"  # read when first used, not at import
        import kernelhub
        from jax._src import xla_bridge
        assert not xla_bridge._backends, "a jax backend was initialised at import"
        assert "libtpu" not in sys.modules, "the TPU runtime was imported"
        print(len(kernelhub.implementations("grouped_matmul")))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip().splitlines()[-1]) >= 1
