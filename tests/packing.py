"""One folder-layout image set packed the ways users hold data: WebDataset tars, a Parquet file in
the Hugging Face `datasets` layout, an Arrow IPC file with a plain binary column."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stoker.pipeline.store.stats import image_files

Sample = tuple[str, int, bytes]  # key, label, bytes


def folder_samples(root: Path) -> tuple[list[Sample], list[str]]:
    """Every file of an ImageNet-layout folder as (stem, label, bytes), labels by sorted class folder."""
    files = image_files(root)
    classes = sorted({p.parent.name for p in files})
    return [(p.stem, classes.index(p.parent.name), p.read_bytes()) for p in files], classes


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_tars(samples: list[Sample], folder: Path, per_tar: int, label: str = "cls", field: str = "label",
               ext: str = "jpg", mode: str = "w") -> list[Path]:
    """WebDataset shards of `per_tar` samples: KEY.jpg beside KEY.cls (the label as text) or KEY.json."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, start in enumerate(range(0, len(samples), per_tar)):
        path = folder / f"shard-{index:06d}.tar{'.gz' if mode == 'w:gz' else ''}"
        with tarfile.open(path, mode) as tar:
            for key, value, data in samples[start: start + per_tar]:
                add_member(tar, f"{key}.{ext}", data)
                if label == "cls":
                    add_member(tar, f"{key}.cls", str(value).encode())
                else:
                    add_member(tar, f"{key}.json", json.dumps({field: value, "source": "test"}).encode())
        paths.append(path)
    return paths


def hf_metadata(classes: list[str]) -> dict[bytes, bytes]:
    """The schema metadata `datasets` writes for an Image column and a ClassLabel column."""
    features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def hf_table(samples: list[Sample], classes: list[str] | None) -> pa.Table:
    """`image: struct<bytes, path>, label: int64`, as `datasets` stores an image classification set."""
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array([{"bytes": data, "path": f"{key}.JPEG"} for key, _, data in samples], image_type)
    table = pa.table({"image": images, "label": pa.array([label for _, label, _ in samples], pa.int64())})
    return table.replace_schema_metadata(hf_metadata(classes)) if classes else table


def write_hf_parquet(samples: list[Sample], path: Path, classes: list[str] | None = None,
                     row_group_size: int = 16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(hf_table(samples, classes), path, row_group_size=row_group_size)
    return path


def write_arrow_binary(samples: list[Sample], path: Path, batch_rows: int = 50, stream: bool = False) -> Path:
    """An Arrow IPC file (or stream) with `key: string, jpg: binary, cls: int32` in batches of `batch_rows`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"key": [k for k, _, _ in samples], "jpg": pa.array([d for _, _, d in samples], pa.binary()),
                      "cls": pa.array([label for _, label, _ in samples], pa.int32())})
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with opener(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    return path
