"""make test's parallel integration phase: a worker takes whole modules, and the modules
that share one fleet or one Ray cluster together (tests/conftest.py)."""

from __future__ import annotations

from tests.conftest import integration_scope


def test_a_module_is_one_scope() -> None:
    a = integration_scope("tests/integration/test_lora_serving.py::test_x")
    assert a == integration_scope("tests/integration/test_lora_serving.py::test_y[p]")
    assert a != integration_scope("tests/integration/test_lora_export.py::test_x")


def test_the_fleet_and_ray_modules_share_their_scopes() -> None:
    fleet = {integration_scope(f"tests/integration/{m}.py::t")
             for m in ("test_examples", "test_inference_fleet")}  # fmt: skip
    ray = {integration_scope(f"tests/integration/{m}.py::t")
           for m in ("test_ray_multinode", "test_ray_placement")}  # fmt: skip
    assert fleet == {"fleet"} and ray == {"ray"}
