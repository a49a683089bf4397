"""The transform contract: a team's own per-sample pipeline, run by every worker of the fleet.

A transform is named, never shipped. A job names it by import path (`package.module:name`)
or by an entry point of the `stoker.transforms` group (the built-in `train` and `eval` are
two), with JSON parameters; each worker imports it from its own environment and calls the
named factory with them. The job also carries the version of what provides it (`module_version`),
and a worker whose import differs, or fails, refuses the job (`TransformRefused`).

Per sample a transform gets the record (`Sample`: id, key, label, stored bytes), a
`random.Random` seeded from (job seed, epoch, sample id) alone, so a sample comes out the same
whichever process or host makes it, and, as it asks (`takes`):

- "crop": crop-first. Stoker reads the JPEG header, asks `crop(width, height, rng)` for the
  window, decodes only that window at the coarsest DCT scale that still covers `crop_size`
  (with the shard's restart index), resizes it to `crop_size` square, mirrors it when the crop
  says so, and passes the pixels. The MLPerf train and eval transforms are this kind.
- "pixels": the whole image, decoded (pillow-simd).
- "bytes": nothing decoded (`pixels` is None); the transform reads `sample.data` itself: any
  record, not only JPEGs.

Pixels are a numpy array (height, width, 3) of uint8 RGB: what every array library takes, and
what the built-ins return as they are (a PIL transform wraps it with `Image.fromarray`). They
are read-only (a view of the decoder's buffer, not copied for you): copy before writing in
place. Outputs are numpy arrays or numpy scalars, never Python numbers or lists.

It returns named arrays whose names, dtypes and shapes it declared up front (`outputs`); the
worker writes them into the batch's buffers and adds `label` (int32, the record's). A sample it
raises on is skipped and counted with the exception's text; an output that is not what was
declared is a broken transform (`TransformOutputError`): the worker refuses the job, naming
the field, at the first sample.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import random
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from stoker.pipeline.tensors import TensorSpec
from stoker.protos.errors import ConfigError

GROUP = "stoker.transforms"
TAKES = ("crop", "pixels", "bytes")
LABEL = "label"  # added by the worker from the record: no transform declares it
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
IMPORT_PATH = re.compile(rf"{_DOTTED}:{_DOTTED}")
_ENTRY_POINT = re.compile(r"[A-Za-z_][\w.-]*")


class TransformError(ConfigError):
    """A transform name, its parameters or what it declares cannot make a job (caught at parse time)."""


class TransformRefused(TransformError):
    """This worker cannot run the job's transform as the job pinned it: not importable here, or
    another version. One line, sent to the dispatcher, which fails the job."""


class TransformOutputError(TransformError):
    """A transform returned something other than what it declared: a bug, not bad data."""


@dataclass(frozen=True)
class Output:
    """One array a transform returns per sample: its numpy dtype and per-sample shape."""

    dtype: str
    shape: tuple[int, ...]

    def spec(self) -> TensorSpec:
        """The batch tensor this output becomes (numpy's dtype string, so the wire can check it)."""
        return TensorSpec(np.dtype(self.dtype).str, tuple(int(d) for d in self.shape))


@dataclass(frozen=True)
class Sample:
    """One record as a transform sees it."""

    sample_id: int  # global, stable across runs: what the random generator is seeded with
    key: str  # the record's name in its source (a file path, a WebDataset key)
    label: int
    data: bytes | memoryview  # the stored bytes: a JPEG, or any record a "bytes" transform reads


@runtime_checkable
class ImageTransform(Protocol):
    """What a worker calls. `crop` and `crop_size` (`CropFirst`) are read only when `takes == "crop"`.
    It is called from one thread per process; it may keep state, but its output must depend only
    on (sample, rng, pixels), or a sample made again after a lost host would differ."""

    takes: str  # "crop", "pixels" or "bytes"
    outputs: Mapping[str, Output]

    def __call__(self, sample: Sample, rng: random.Random, pixels: np.ndarray | None) -> Mapping[str, np.ndarray]:
        ...


@dataclass(frozen=True)
class Crop:
    """A crop box in stored-image pixels, and whether to mirror the result."""

    left: float
    top: float
    width: float
    height: float
    flip: bool = False


class CropFirst(Protocol):
    """The extra half of a crop-first transform."""

    crop_size: int  # the side the window is resized to before __call__ sees it

    def crop(self, width: int, height: int, rng: random.Random) -> Crop:
        """The box to cut from a stored image of this size, drawn from `rng` (seeded by the sample)."""
        ...


@dataclass(frozen=True)
class Resolved:
    """A named transform as this process imported it."""

    name: str
    params: str  # canonical JSON
    version: str
    transform: ImageTransform

    @property
    def outputs(self) -> dict[str, TensorSpec]:
        return {name: out.spec() for name, out in self.transform.outputs.items()}


def check_name(name: str) -> str:
    """`package.module:attribute` or an entry point name; refused before anything is imported."""
    if not (IMPORT_PATH.fullmatch(name) or _ENTRY_POINT.fullmatch(name)):
        raise TransformError(f"--transform {name!r}: give package.module:name (an importable factory or "
                             f"transform), or the name of a {GROUP!r} entry point such as train or eval")
    return name


def parse_params(text: str) -> str:
    """The parameters as canonical JSON (a JSON object, keys sorted), so equal jobs compare equal."""
    if not text:
        return ""
    try:
        params = json.loads(text, parse_constant=_not_json, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, TransformError) as exc:
        raise TransformError(f"--transform-params is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise TransformError(f"--transform-params must be a JSON object of keyword arguments, not {text!r}")
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def _not_json(constant: str) -> object:
    raise TransformError(f"{constant} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [key for key, _ in pairs]
    doubled = sorted({key for key in keys if keys.count(key) > 1})
    if doubled:
        raise TransformError(f"keys given twice: {', '.join(doubled)}")
    return dict(pairs)


def _entry_point(name: str) -> metadata.EntryPoint:
    found = metadata.entry_points(group=GROUP, name=name)
    if not found:
        known = sorted(ep.name for ep in metadata.entry_points(group=GROUP))
        raise TransformRefused(f"no transform named {name!r} here: the {GROUP!r} entry points installed are "
                               f"{', '.join(known) or 'none'} (or give package.module:name)")
    return next(iter(found))


def import_named(name: str, what: str = "transform") -> tuple[object, str]:
    """The named object (`module:Name` or an entry point) and the version of what provides it; `what` names
    it in a refusal (a transform, a tokenizer, a text source)."""
    check_name(name)
    if ":" not in name:
        entry = _entry_point(name)
        try:
            obj = entry.load()
        except (Exception, SystemExit) as exc:  # a module may even call sys.exit() as it loads
            raise TransformRefused(f"{what} {name!r} ({entry.value}) does not import here: "
                                   f"{type(exc).__name__}: {exc}") from None
        dist = entry.dist
        return obj, f"{dist.name} {dist.version}" if dist is not None else module_version(entry.module)
    module_name, attribute = name.split(":")
    try:
        obj = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # a module may even call sys.exit() as it loads
        raise TransformRefused(f"{what} {name!r} does not import here: {type(exc).__name__}: {exc}") from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TransformRefused(f"{what} {name!r}: module {module_name} has no {attribute}") from None
    return obj, module_version(module_name)


def module_version(module_name: str) -> str:
    """What pins the module: the distribution whose files hold it, and its version; else the module's
    `__version__`; else a digest of its package's files (`_digest`), so an edited module never passes
    as the old one. A distribution is matched by the module's own file, not by its top-level name: a
    namespace package (company.*) is shared by several distributions."""
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    where = getattr(module, "__file__", None)
    if where:
        found = _distribution_holding(module_name.split(".")[0], Path(where).resolve())
        if found:
            return found
    declared = getattr(module, "__version__", None)
    if isinstance(declared, str) and declared:
        return f"{module_name} {declared}"
    if not where:
        return f"{module_name} built into Python {sys.version.split()[0]}"
    return f"{module_name} sha256:{_digest(module_name, Path(where))}"


def _distribution_holding(top: str, path: Path) -> str | None:
    for dist_name in metadata.packages_distributions().get(top, []):
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        if any(Path(str(dist.locate_file(f))).resolve() == path for f in dist.files or ()):
            return f"{dist.name} {dist.version}"
    return None


def _digest(module_name: str, path: Path) -> str:
    """The module's file, and every other source file of the outermost regular package that holds it
    (what it may import from beside it; a namespace package's other parts are not read), in a
    stable order. A lone module's siblings are not covered: give it a `__version__`."""
    package = path.parent if (path.parent / "__init__.py").exists() else None
    while package is not None and (package.parent / "__init__.py").exists():
        package = package.parent
    files = sorted({path, *(package.rglob("*.py") if package is not None else ())})
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(file.anchor)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:12]


@lru_cache(maxsize=32)
def resolve(name: str, params: str = "") -> Resolved:
    """Import and build the named transform and check what it declares (raises TransformError)."""
    obj, version = import_named(name)
    kwargs: dict[str, Any] = json.loads(params) if params else {}
    if inspect.isclass(obj) or inspect.isfunction(obj):
        try:
            transform = obj(**kwargs)
        except TypeError as exc:
            raise TransformError(f"transform {name!r} does not take the parameters {params or '{}'}: {exc}") from None
        except (Exception, SystemExit) as exc:  # the factory's own checks of its parameters
            raise TransformError(f"transform {name!r} cannot be made with {params or '{}'}: "
                                 f"{type(exc).__name__}: {exc}") from None
    elif kwargs:
        raise TransformError(f"transform {name!r} is an object, not a factory: it takes no parameters")
    else:
        transform = obj
    return Resolved(name, params, version, check_declared(name, transform))


def check_declared(name: str, transform: object) -> ImageTransform:
    """What a worker relies on before the first sample: a known `takes`, declared outputs, a crop.
    Returns the transform, now known to be one."""
    takes = getattr(transform, "takes", None)
    if takes not in TAKES:
        raise TransformError(f"transform {name!r}: takes must be one of {', '.join(TAKES)}, not {takes!r}")
    if not callable(transform):
        raise TransformError(f"transform {name!r} is not callable as (sample, rng, pixels)")
    outputs = getattr(transform, "outputs", None)
    if not isinstance(outputs, Mapping) or not outputs:
        raise TransformError(f"transform {name!r}: outputs must map names to stoker.Output, not {outputs!r}")
    for field, out in outputs.items():
        if not isinstance(field, str) or not isinstance(out, Output):
            raise TransformError(f"transform {name!r}: output {field!r} must be a stoker.Output, not {out!r}")
        if field == LABEL:
            raise TransformError(f"transform {name!r} declares {LABEL!r}: the worker adds the record's label; "
                                 "name a transformed label otherwise")
        try:
            np.dtype(out.dtype)
        except TypeError:
            raise TransformError(f"transform {name!r}: output {field!r} has no numpy dtype {out.dtype!r}") from None
        if not isinstance(out.shape, tuple) or any(type(d) is not int or d < 1 for d in out.shape):
            raise TransformError(f"transform {name!r}: output {field!r} shape {out.shape} must be positive ints")
    if takes == "crop":
        size = getattr(transform, "crop_size", None)
        if not isinstance(size, int) or size < 1 or not callable(getattr(transform, "crop", None)):
            raise TransformError(f"transform {name!r} takes a crop: it needs crop(width, height, rng) and an int "
                                 f"crop_size, not {size!r}")
    return cast(ImageTransform, transform)  # the checks above are the protocol's, member by member


def check_outputs(name: str, declared: Mapping[str, Output], got: object) -> Mapping[str, np.ndarray]:
    """One sample's return against the declaration; TransformOutputError names the first field off."""
    if not isinstance(got, Mapping):
        raise TransformOutputError(f"transform {name!r} returned {type(got).__name__}, not a mapping of "
                                   f"{sorted(declared)} to arrays")
    if set(got) != set(declared):
        raise TransformOutputError(f"transform {name!r} returned fields {sorted(got)}, declared {sorted(declared)}")
    for field, out in declared.items():
        array = got[field]
        if not isinstance(array, np.ndarray | np.generic):
            raise TransformOutputError(f"transform {name!r}: output {field!r} is a {type(array).__name__}, not a "
                                       f"numpy array (or numpy scalar) of {np.dtype(out.dtype)}{list(out.shape)}")
        shape = getattr(array, "shape", None)
        dtype = getattr(array, "dtype", None)
        if shape != tuple(out.shape) or dtype != np.dtype(out.dtype):
            raise TransformOutputError(f"transform {name!r}: output {field!r} is {dtype}{list(shape or ())}, "
                                       f"declared {np.dtype(out.dtype)}{list(out.shape)}")
    return got


def pinned(name: str, params: str, version: str) -> Resolved:
    """The job's transform as this worker imports it, refused (one line) when it cannot be the job's."""
    try:
        resolved = resolve(name, params)
    except TransformRefused:
        raise
    except TransformError as exc:
        raise TransformRefused(str(exc)) from None
    if version and resolved.version != version:
        raise TransformRefused(f"transform {name!r} is {resolved.version} here, the job runs {version}")
    return resolved
