"""The per-host worker daemon: process pool, leases, credit-aware senders, worker metrics."""
