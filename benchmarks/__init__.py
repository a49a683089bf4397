"""Benchmarks: each prints its figures and writes them under benchmarks/results/."""
