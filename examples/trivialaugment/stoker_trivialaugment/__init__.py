"""TrivialAugment-Wide (Müller & Hutter, 2021) as a Stoker transform, crop-first at 176 px.

Install it on every worker host (`pip install ./examples/trivialaugment`) and name it in the
job: `--transform trivialaugment` (the entry point) or
`--transform stoker_trivialaugment:TrivialAugmentWide --transform-params '{"size": 176}'`.
"""

from stoker_trivialaugment.ops import NUM_BINS, OPS, Op, draw
from stoker_trivialaugment.transform import TrivialAugmentWide

__version__ = "0.1.0"
__all__ = ["NUM_BINS", "OPS", "Op", "TrivialAugmentWide", "draw"]
