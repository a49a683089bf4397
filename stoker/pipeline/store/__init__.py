"""The shard store: where shards live and how they are read. The shard format and its manifest, storage
URIs, a host's cache of remote shards with their checks, locks, safe writes, and the record sources and
shuffle that `stoker prepare` reads through. It imports nothing else of the data model."""
