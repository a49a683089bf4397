"""`python -m benchmarks NAME`: run one benchmark (spine or text)."""

import sys

from benchmarks import spine, text

BENCHMARKS = {"spine": spine.main, "text": text.main}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "spine"
    if name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    BENCHMARKS[name]()
