"""Importing kernelhub loads nothing; its first use registers the implementations and does
nothing else (no jax backend, no TPU runtime, no environment read before a call)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap


def _run(code: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=300, env=env)
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


def test_threads_that_touch_kernelhub_first_at_once_all_get_their_names():
    """Several threads' first use of kernelhub, before the program imported jax, each by another
    name: jax must be imported once, by one of them, while the others wait (a thread entering
    jax at one of its submodules while another runs `import jax` got a half-initialised jax)."""
    out = _run("""
        import sys, threading
        import kernelhub
        assert "jax" not in sys.modules
        firsts = {
            "tuning": lambda: kernelhub.tuning.heuristic,
            "export": lambda: kernelhub.export.export,
            "parallel": lambda: kernelhub.parallel.route,
            "grouped_matmul": lambda: kernelhub.grouped_matmul,
            "testing": lambda: kernelhub.testing.check_implementations,
            "ragged_dot": lambda: kernelhub.ragged_dot,
            "quantization": lambda: kernelhub.quantization.QuantizedArray,
            "from-import": lambda: __import__("kernelhub", fromlist=["quantized_training"]),
        }
        barrier = threading.Barrier(len(firsts))
        errors = []

        def first_use(name, touch):
            barrier.wait()
            try:
                touch()
            except Exception as error:
                errors.append(f"{name}: {type(error).__name__}: {error}")

        threads = [threading.Thread(target=first_use, args=item) for item in firsts.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a first use hung"
        print(errors)
    """, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.strip().splitlines()[-1] == "[]", out


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


def test_a_jitted_function_traces_once_on_its_first_calls():
    """kernelhub's jax options exist before the first trace: made during one, they would change
    jit's cache key under the function, which would then trace and compile a second time."""
    out = _run("""
        import jax, jax.numpy as jnp
        from kernelhub import grouped_matmul  # first use, as a user's module starts
        traces = []

        @jax.jit
        def step(lhs, rhs, sizes):
            traces.append(1)
            return grouped_matmul(lhs, rhs, sizes)

        lhs, rhs, sizes = jnp.ones((8, 4)), jnp.ones((2, 4, 4)), jnp.array([3, 5], jnp.int32)
        for _ in range(3):
            step(lhs, rhs, sizes).block_until_ready()
        print(len(traces))
    """)
    assert out.strip().splitlines()[-1] == "1"


def test_a_plain_install_can_save_an_export():
    """jax.export's serialize() needs flatbuffers, which jax itself does not install: it is a
    runtime dependency, so a user who installs kernelhub without extras can save an export."""
    import tomllib

    with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as file:
        project = tomllib.load(file)["project"]
    names = {re.split(r"[<>=!~; \[]", requirement, maxsplit=1)[0]
             for requirement in project["dependencies"]}
    assert "flatbuffers" in names
