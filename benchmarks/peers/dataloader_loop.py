"""PyTorch DataLoader + torchvision RandomResizedCrop/RandomHorizontalFlip on PIL images."""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
import warnings

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class JpegFiles(Dataset):
    def __init__(self, paths: list[str], area: tuple[float, float]) -> None:
        self.paths = paths
        self.transform = transforms.Compose([
            transforms.RandomResizedCrop(224, scale=area, ratio=(3 / 4, 4 / 3)),
            transforms.RandomHorizontalFlip(),
        ])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        with Image.open(self.paths[index]) as image:
            image = image.convert("RGB")
            return torch.from_numpy(np.asarray(self.transform(image)))  # uint8 (224, 224, 3)


def _pin_worker_id(core: int, worker_id: int) -> None:
    os.sched_setaffinity(0, {core})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--min-area", type=float, default=0.05)
    parser.add_argument("--worker-core", type=int, help="pin the (single) worker here and the main process elsewhere")
    args = parser.parse_args()
    torch.set_num_threads(1)
    init = None
    if args.worker_core is not None:
        init = functools.partial(_pin_worker_id, args.worker_core)
        os.sched_setaffinity(0, os.sched_getaffinity(0) - {args.worker_core})
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # read-only is fine here
    paths = open(args.files).read().split()
    loader = DataLoader(JpegFiles(paths, (args.min_area, 1.0)), batch_size=args.batch_size,
                        num_workers=args.workers, shuffle=False, persistent_workers=False, worker_init_fn=init)
    images, started = 0, None
    for batch in loader:
        assert batch.shape[1:] == (224, 224, 3) and batch.dtype == torch.uint8
        if started is None:
            started = time.perf_counter()
            continue
        images += batch.shape[0]
    seconds = time.perf_counter() - started
    import PIL

    print(json.dumps({"images": images, "seconds": seconds, "images_per_s": images / seconds,
                      "versions": {"torch": torch.__version__, "pillow": PIL.__version__}}))


if __name__ == "__main__":
    main()
