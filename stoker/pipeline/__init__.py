"""Stoker's data model and transforms: shards, manifests, epoch plans, decode and augment.

Nothing in this package knows about sockets or processes.
"""
