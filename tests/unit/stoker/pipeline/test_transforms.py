"""The transform contract's names, parameters, versions and checks, with modules written here."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest

from stoker.pipeline.images.augment import EvalTransform, TrainTransform
from stoker.pipeline.transforms import (
    Output,
    TransformError,
    TransformOutputError,
    TransformRefused,
    check_name,
    check_outputs,
    parse_params,
    pinned,
    resolve,
)

MODULE = '''
import numpy as np
from stoker.pipeline.transforms import Output
{version}

class Flat:
    takes = "bytes"
    outputs = {{"n": Output("int64", ())}}

    def __init__(self, scale=1):
        if scale < 0:
            raise ValueError("scale must not be negative")
        self.scale = scale

    def __call__(self, sample, rng, pixels):
        return {{"n": np.int64(len(sample.data) * self.scale)}}


def make(scale=2):
    return Flat(scale)


READY = Flat()
NOT_A_TRANSFORM = object()


class Labelled(Flat):
    outputs = {{"label": Output("int32", ())}}


class CropWithoutWindow(Flat):
    takes = "crop"


class BoolShape(Flat):
    outputs = {{"n": Output("int64", (True, 2))}}
'''


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Write a module (with `version`: its __version__ line) and make it importable; fresh per test."""
    def write(name: str, version: str = "") -> str:
        (tmp_path / f"{name}.py").write_text(MODULE.format(version=version))
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop(name, None)
        resolve.cache_clear()
        return name
    yield write
    resolve.cache_clear()


@pytest.mark.parametrize("name", ["train", "eval", "my-transforms.fast", "pkg.mod:Thing", "a:b.c"])
def test_well_formed_names_pass(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "pkg.mod:", ":Thing", "pkg mod:Thing", "pkg.mod:Thing:x", "1pkg:x", "a/b"])
def test_malformed_names_are_refused_before_any_import(name):
    with pytest.raises(TransformError, match="package.module:name"):
        check_name(name)


def test_parameters_are_a_json_object_kept_in_one_canonical_spelling():
    assert parse_params('{"b": 1,  "a": [2]}') == parse_params('{"a":[2],"b":1}') == '{"a":[2],"b":1}'
    assert parse_params("") == ""
    for bad, says in (("[1]", "JSON object"), ("{", "not JSON"), ('"x"', "JSON object"),
                      ('{"a": NaN}', "NaN is not a JSON value"), ('{"a": 1, "b": 2, "a": 3}', "keys given twice: a")):
        with pytest.raises(TransformError, match=says):
            parse_params(bad)


def test_a_class_a_function_and_an_object_are_each_a_transform(module):
    name = module("own_a", '__version__ = "3.1"')
    assert resolve(f"{name}:Flat", '{"scale":5}').transform.scale == 5
    assert resolve(f"{name}:make").transform.scale == 2
    ready = resolve(f"{name}:READY")
    assert ready.version == f"{name} 3.1" and ready.outputs["n"].dtype == "<i8"
    with pytest.raises(TransformError, match="not a factory"):
        resolve(f"{name}:READY", '{"scale":5}')
    with pytest.raises(TransformError, match="does not take the parameters"):
        resolve(f"{name}:Flat", '{"colour":1}')
    with pytest.raises(TransformError, match='cannot be made with {"scale":-1}: ValueError: scale must not be'):
        resolve(f"{name}:Flat", '{"scale":-1}')


def test_a_module_without_a_version_is_pinned_by_its_source_so_an_edit_is_another_version(module, tmp_path):
    name = module("own_b")
    first = resolve(f"{name}:Flat").version
    assert first.startswith(f"{name} sha256:")
    (tmp_path / f"{name}.py").write_text(MODULE.format(version="# edited"))
    sys.modules.pop(name)
    resolve.cache_clear()
    with pytest.raises(TransformRefused, match="here, the job runs"):
        pinned(f"{name}:Flat", "", first)


def test_a_worker_refuses_what_it_cannot_import_or_imports_at_another_version(module):
    name = module("own_c", '__version__ = "2.0"')
    assert pinned(f"{name}:Flat", "", f"{name} 2.0").version == f"{name} 2.0"
    with pytest.raises(TransformRefused, match=f"is {name} 2.0 here, the job runs {name} 1.0"):
        pinned(f"{name}:Flat", "", f"{name} 1.0")
    with pytest.raises(TransformRefused, match="No module named 'nowhere_to_be_found'"):
        pinned("nowhere_to_be_found:Flat", "", "x 1")
    with pytest.raises(TransformRefused, match=f"module {name} has no Gone"):
        pinned(f"{name}:Gone", "", "x 1")
    with pytest.raises(TransformRefused, match="no transform named 'nosuch'.*train"):
        pinned("nosuch", "", "")


@pytest.mark.parametrize("attribute, says", [
    ("NOT_A_TRANSFORM", "takes must be one of"),
    ("Labelled", "declares 'label'"),
    ("CropWithoutWindow", "needs crop"),
    ("BoolShape", "must be positive ints"),
])
def test_what_a_transform_declares_is_checked_before_the_first_sample(module, attribute, says):
    name = module("own_d")
    with pytest.raises(TransformError, match=says):
        resolve(f"{name}:{attribute}")


def test_the_built_ins_are_entry_points_of_the_contract():
    train = resolve("train", '{"max_area":1.0,"min_area":0.05,"size":176}')
    assert isinstance(train.transform, TrainTransform) and train.version.startswith("stoker ")
    assert train.outputs == {"image": Output("uint8", (176, 176, 3)).spec()}
    assert isinstance(resolve("eval", '{"size":64}').transform, EvalTransform)
    pixels = np.zeros((64, 64, 3), np.uint8)
    assert resolve("eval", '{"size":64}').transform(None, random.Random(0), pixels)["image"] is pixels


def test_an_output_that_is_not_what_was_declared_is_named():
    declared = {"image": Output("uint8", (4, 4, 3)), "mean": Output("float32", ())}
    good = {"image": np.zeros((4, 4, 3), np.uint8), "mean": np.float32(0)}
    assert check_outputs("t", declared, good) is good
    for got, says in (
        ({"image": np.zeros((4, 4, 3), np.uint8)}, r"returned fields \['image'\], declared \['image', 'mean'\]"),
        ({**good, "image": np.zeros((4, 3, 3), np.uint8)}, r"output 'image' is uint8\[4, 3, 3\]"),
        ({**good, "mean": np.float64(0)}, r"output 'mean' is float64\[\], declared float32\[\]"),
        ({**good, "mean": 0.5}, r"output 'mean' is a float, not a numpy array"),
        ([good["image"]], "returned list, not a mapping"),
    ):
        with pytest.raises(TransformOutputError, match=says):
            check_outputs("t", declared, got)


def test_a_module_of_a_package_is_pinned_by_the_package_s_files_so_an_edited_helper_is_another_version(
        tmp_path, monkeypatch):
    package = tmp_path / "ownpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("SCALE = 1\n")
    (package / "augs.py").write_text(MODULE.format(version="from ownpkg.helper import SCALE"))
    monkeypatch.syspath_prepend(str(tmp_path))
    resolve.cache_clear()
    first = resolve("ownpkg.augs:Flat").version
    (package / "helper.py").write_text("SCALE = 999\n")
    for name in ("ownpkg", "ownpkg.augs", "ownpkg.helper"):
        sys.modules.pop(name, None)
    resolve.cache_clear()
    try:
        with pytest.raises(TransformRefused, match="here, the job runs"):
            pinned("ownpkg.augs:Flat", "", first)
    finally:
        resolve.cache_clear()


def test_a_module_built_into_python_is_pinned_by_python_s_version_and_refused_as_no_transform():
    with pytest.raises(TransformError, match="takes must be one of"):
        resolve("builtins:print")
    from stoker.pipeline.transforms import module_version

    assert module_version("builtins").startswith("builtins built into Python ")


class _Raises:
    takes = "bytes"
    outputs = {"n": Output("int64", ())}

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __call__(self, sample, rng, pixels):
        raise self.exc


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize("exc, says", [
    (SystemExit(3), "transform raised SystemExit: 3"),
    (KeyboardInterrupt(), "transform raised KeyboardInterrupt: "),
    (_Unprintable(), "transform raised _Unprintable: (its text cannot be made)"),
])
def test_whatever_a_transform_raises_skips_the_sample_and_never_the_process(exc, says):
    from stoker.pipeline.images.batching import HostTransform, TransformFailed
    from stoker.pipeline.transforms import Sample

    with pytest.raises(TransformFailed) as failed:
        HostTransform(_Raises(exc), name="t").prepare(Sample(1, "k", 0, b"x"), random.Random(0))
    assert str(failed.value) == says


def test_a_transform_that_swallows_the_timeout_is_interrupted_again():
    import time

    from stoker.pipeline.images.batching import HostTransform, TransformFailed
    from stoker.pipeline.transforms import Sample

    class Stubborn(_Raises):
        def __call__(self, sample, rng, pixels):
            while True:
                try:
                    time.sleep(10)
                except Exception:  # noqa: BLE001, S110 - swallows whatever it can, as careless retry code does
                    pass

    started = time.monotonic()
    with pytest.raises(TransformFailed, match="ran past --transform-timeout 0.2 s"):
        HostTransform(Stubborn(ValueError()), name="t", timeout_s=0.2).prepare(Sample(1, "k", 0, b"x"),
                                                                               random.Random(0))
    assert time.monotonic() - started < 3
