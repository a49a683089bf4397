"""stoker/accel/optional.py: a missing accelerator-side dependency is one line naming the install."""

from __future__ import annotations

import pytest

from stoker.accel.optional import require
from stoker.protos.errors import StateError


def test_an_installed_module_passes():
    require("numpy.linalg", "--accel torch")


def test_a_missing_module_names_the_feature_and_the_install():
    with pytest.raises(StateError, match=r"--decode-on accelerator needs no_such_dali\.x, which is not installed: "
                                         r"pip install 'stoker\[accel\]' \(worker hosts need only 'stoker'\)"):
        require("no_such_dali.x", "--decode-on accelerator")
