"""pillow-simd and pillow both install `PIL`; the worker's decoder must be pillow-simd."""

import importlib.metadata as metadata
from pathlib import Path

import PIL
from PIL import features


def test_pil_comes_from_pillow_simd():
    files = {str(f) for f in metadata.distribution("pillow-simd").files or []}
    assert "PIL/__init__.py" in files
    assert Path(PIL.__file__).parts[-2:] == ("PIL", "__init__.py")
    names = {d.metadata["Name"].lower() for d in metadata.distributions()}
    assert "pillow" not in names, "stock pillow is installed and may shadow pillow-simd"
    assert PIL.__version__ == metadata.version("pillow-simd")


def test_decoder_is_libjpeg_turbo():
    assert features.check_feature("libjpeg_turbo")


def test_the_crop_decoder_is_built_where_libjpeg_turbo_headers_are():
    """`make setup` installs the headers, so a silent fallback to pillow-simd would be a build bug."""
    from pathlib import Path

    from stoker.pipeline.images import augment

    if Path("/usr/include/jpeglib.h").exists():
        assert augment.CROP_DECODER_AVAILABLE
        assert augment._jpegcrop.LIBJPEG_TURBO_VERSION_NUMBER >= 2000000
