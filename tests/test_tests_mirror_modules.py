"""Tests mirror modules: every module with logic has its unit test file at the mirrored path
(tests/unit/PACKAGE/test_MODULE.py), or is named below with the integration tests that start
the real processes it only makes sense inside. A new module with neither fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "protos", "workers", "accel", "stoker")
E2E = "tests/integration/"
# module -> where it is exercised instead (the daemons, sockets and training steps it drives)
COVERED_BY = {
    "pipeline/batching": [E2E + "test_awkward_jpegs.py", "tests/unit/workers/test_sources.py"],
    "pipeline/files": [E2E + "test_resume.py"],
    "pipeline/image_layout": ["tests/unit/pipeline/test_kinds.py"],
    "pipeline/photos": ["tests/unit/pipeline/test_prepare.py"],
    "pipeline/seeds": ["tests/unit/pipeline/test_augment.py"],
    "pipeline/stats": ["tests/unit/pipeline/test_prepare.py"],
    "pipeline/synth": ["tests/unit/pipeline/test_prepare.py"],
    "pipeline/tensors": ["tests/unit/pipeline/test_kinds.py"],
    "pipeline/text/corpus": ["tests/unit/pipeline/text/test_prepare.py"],
    "pipeline/text/layout": ["tests/unit/pipeline/text/test_packing.py"],
    "pipeline/wheels": ["tests/unit/pipeline/text/test_prepare.py"],
    "protos/control_client": [E2E + "test_exactly_once.py", E2E + "test_dispatch.py"],
    "protos/curve": [E2E + "test_curve.py", E2E + "test_strangers.py"],
    "protos/endpoints": [E2E + "test_exactly_once.py"],
    "protos/private_files": ["tests/unit/protos/test_job_secret.py", E2E + "test_dispatch.py"],
    "protos/sd_notify": [E2E + "test_deploy.py"],
    "protos/zap": [E2E + "test_curve.py", E2E + "test_strangers.py"],
    "workers/daemon": [E2E + "test_exactly_once.py", E2E + "test_lifecycle.py", E2E + "test_deploy.py"],
    "workers/lifeline": [E2E + "test_lifecycle.py"],
    "workers/metrics": ["tests/unit/workers/test_sources.py", E2E + "test_exactly_once.py"],
    "workers/multiproc": [E2E + "test_exactly_once.py"],
    "workers/process": [E2E + "test_exactly_once.py", E2E + "test_lifecycle.py"],
    "accel/accelerators": ["tests/unit/accel/test_stepping.py"],
    "accel/aio": [E2E + "test_exactly_once.py"],
    "accel/batch": [E2E + "test_text_job.py"],
    "accel/bert_accel": [E2E + "test_torch_step.py"],
    "accel/consumer": [E2E + "test_exactly_once.py", E2E + "test_strangers.py"],
    "accel/consumer_config": [E2E + "test_curve.py", "tests/unit/stoker/test_options.py"],
    "accel/control/metrics": [E2E + "test_deploy.py", E2E + "test_dispatch.py"],
    "accel/control/remote": [E2E + "test_dispatch.py", E2E + "test_data_parallel.py"],
    "accel/control/service": [E2E + "test_dispatch.py"],
    "accel/jpeg_decode": [E2E + "test_decode_on_accelerator.py", E2E + "test_awkward_jpegs.py"],
    "accel/loader": [E2E + "test_data_parallel.py", E2E + "test_exactly_once.py"],
    "accel/metrics": [E2E + "test_deploy.py", "tests/unit/accel/test_receiver.py"],
    "accel/models/resnet": [E2E + "test_torch_step.py"],
    "accel/optimizers": [E2E + "test_torch_step.py"],
    "accel/prefetch": [E2E + "test_torch_step.py"],
    "accel/profiles": ["tests/unit/accel/test_stepping.py", "tests/unit/stoker/test_planning.py"],
    "accel/schema": ["tests/unit/accel/test_receiver.py", "tests/unit/workers/test_sources.py"],
    "accel/steps": [E2E + "test_data_parallel.py"],
    "accel/stream": ["tests/unit/accel/test_receiver.py", E2E + "test_data_parallel.py"],
    "accel/torch_accel": [E2E + "test_torch_step.py"],
    "accel/training": [E2E + "test_torch_step.py"],
    "accel/training_loop": [E2E + "test_torch_step.py", E2E + "test_exactly_once.py"],
    "stoker/cli": [E2E + "test_flags.py", "tests/unit/stoker/test_options.py"],
    "stoker/cli_experiments": [E2E + "test_bottleneck.py", "tests/unit/stoker/test_planning.py"],
    "stoker/datasets": [E2E + "test_exactly_once.py"],
    "stoker/embedded": [E2E + "test_exactly_once.py", E2E + "test_data_parallel.py"],
    "stoker/flags": [E2E + "test_flags.py"],
    "stoker/lab/cluster": [E2E + "test_lab.py"],
    "stoker/lab/system": [E2E + "test_lab.py"],
}


def modules_with_logic() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py") or path.name.endswith("_pb2.py"):
                continue
            if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                   for node in ast.parse(path.read_text()).body):
                found.append(path.relative_to(ROOT).with_suffix("").as_posix())
    return found


def unit_test_of(module: str) -> Path:
    folder, _, name = module.rpartition("/")
    return ROOT / "tests" / "unit" / folder / f"test_{name.lstrip('_')}.py"


def test_every_module_with_logic_is_tested_at_its_mirror_or_says_where():
    untested = [m for m in modules_with_logic() if not unit_test_of(m).exists() and m not in COVERED_BY]
    assert untested == [], "write tests/unit/.../test_MODULE.py for these (or say in COVERED_BY where they run)"


def test_the_list_of_exceptions_points_at_real_tests_and_does_not_go_stale():
    modules = set(modules_with_logic())
    for module, tests in COVERED_BY.items():
        assert module in modules, f"{module} is gone or has no logic: drop it from COVERED_BY"
        assert not unit_test_of(module).exists(), f"{module} has its unit test now: drop it from COVERED_BY"
        for test in tests:
            assert (ROOT / test).exists(), f"{test} (for {module}) does not exist"
