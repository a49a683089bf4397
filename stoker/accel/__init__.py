"""The accelerator host: receiver, prefetch, training steps, and the job's dispatcher."""
