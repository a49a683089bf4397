"""Peer loaders, run in the benchmark's own environment (benchmarks/work/peer-venv), never in Stoker's.

Each script takes a file list, produces uint8 224x224x3 random-resized-crop + flip batches
of 64 the way a user of that library would, and prints one JSON line with its rate. The
first batch is warm-up and not timed.
"""
