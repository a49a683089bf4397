"""Stoker: host-side data pipeline service that keeps accelerators fed."""

__version__ = "0.1.0"
