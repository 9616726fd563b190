"""examples/moe_train.py on 8 simulated devices: the routed layout trains like one device."""

from __future__ import annotations

import jax
import pytest

if jax.device_count() < 8:
    pytest.skip("needs 8 devices: tests/test_parallel.py runs this in a subprocess",
                allow_module_level=True)

from moe_cases import load_example


@pytest.mark.standard_promotion(reason="optax's optimizers mix int32 step counts with floats")
def test_example_trains_on_a_mesh_and_loss_falls():
    result = load_example().main(["--steps", "25"])
    assert result["layout"] == "routed" and result["devices"] == 8
    assert result["dropped"] == 0  # the default capacity never drops
    losses = result["losses"]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
