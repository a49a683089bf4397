"""stoker/pipeline/store/stats.py: what an ImageNet-layout folder holds, read from JPEG headers."""

from __future__ import annotations

import pytest
from PIL import Image

from stoker.pipeline.store.stats import folder_stats, image_files


def _jpeg(path, size, mode="RGB", **save) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size).save(path, "JPEG", **save)


@pytest.mark.parametrize("under_train", [True, False])
def test_the_statistics_count_sizes_modes_and_progressive_files(tmp_path, under_train):
    base = tmp_path / "train" if under_train else tmp_path
    _jpeg(base / "n1" / "a.JPEG", (500, 375))
    _jpeg(base / "n1" / "b.JPEG", (100, 300), mode="L")
    _jpeg(base / "n2" / "c.JPEG", (200, 100), mode="CMYK")
    _jpeg(base / "n2" / "d.JPEG", (300, 500), progressive=True)
    files = image_files(tmp_path)
    assert [p.name for p in files] == ["a.JPEG", "b.JPEG", "c.JPEG", "d.JPEG"]
    stats = folder_stats(tmp_path)
    assert stats.images == 4 and stats.total_bytes == sum(p.stat().st_size for p in files)
    assert stats.mean_bytes == stats.total_bytes / 4
    assert (stats.mean_width, stats.mean_height) == (275.0, 318.75)
    assert stats.long_side_500_fraction == 0.5
    assert stats.greyscale_fraction == stats.cmyk_fraction == stats.progressive_fraction == 0.25
    assert stats.as_dict()["images"] == 4


def test_an_empty_folder_is_an_error(tmp_path):
    (tmp_path / "train" / "n1").mkdir(parents=True)
    with pytest.raises(ValueError, match="no images below"):
        folder_stats(tmp_path)
