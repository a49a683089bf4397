"""Write a labelled image set as Parquet in the Hugging Face `datasets` layout, to try
`stoker prepare parquet` on (see README.md here).

    python examples/parquet_dataset/make_parquet.py OUT [--images 400] [--classes 10] [--files 2]

The images are Stoker's ImageNet-like stand-ins (stoker.datasets.imagenet_like: crops of real
photographs, as JPEGs). They are written as `datasets` writes an image classification split:
OUT/data/train-0000i-of-0000n.parquet with an `image` column `struct<bytes: binary, path: string>`,
a `label` column of int64, the class names as a ClassLabel in the schema's `huggingface` metadata,
and row groups of 100 rows.
"""

import argparse
import json
import math
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stoker.datasets import imagenet_like


def labelled_images(images: int, classes: int, seed: int) -> tuple[list[tuple[dict, int]], list[str]]:
    """([({bytes, path}, label), ...], class names): generated as a folder, read back in class order."""
    with tempfile.TemporaryDirectory() as folder:
        files = imagenet_like(folder, images, classes, seed)  # folder/train/<wnid>/<wnid>_<n>.JPEG
        classes = sorted({p.parent.name for p in files})
        return [({"bytes": p.read_bytes(), "path": p.name}, classes.index(p.parent.name)) for p in files], classes


def write_split(rows: list[tuple[dict, int]], classes: list[str], out: Path, files: int) -> list[Path]:
    features = {"image": {"_type": "Image"}, "label": {"names": classes, "_type": "ClassLabel"}}
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image), ("label", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    (out / "data").mkdir(parents=True, exist_ok=True)
    per_file = math.ceil(len(rows) / files)
    paths = []
    for index in range(files):
        part = rows[index * per_file: (index + 1) * per_file]
        table = pa.table({"image": [i for i, _ in part], "label": [label for _, label in part]}, schema=schema)
        paths.append(out / "data" / f"train-{index:05d}-of-{files:05d}.parquet")
        pq.write_table(table, paths[-1], row_group_size=100)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--files", type=int, default=2, help="Parquet files the split is cut into (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows, classes = labelled_images(args.images, args.classes, args.seed)
    for path in write_split(rows, classes, args.out, args.files):
        print(f"wrote {path}")
    print(f"{len(rows)} images in {len(classes)} classes; next: "
          f"stoker prepare parquet '{args.out}/data/train-*.parquet' SHARDS_DIR")


if __name__ == "__main__":  # imagenet_like() starts a pool of processes, and each imports this file
    main()
