"""Stoker's wire protocol: protobuf messages (stoker.proto) and the framing around them.

Nothing in this package knows about images.
"""
