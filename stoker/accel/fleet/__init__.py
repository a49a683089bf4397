"""The fleet (`stoker fleet`): one pool of worker hosts shared by many jobs. Its book (hosts, jobs,
who runs what), the allocation policy (weighted max-min, progressive filling), its service and options,
and `stoker status` on its metrics. A job's side of it (its seat, its beats) is the control plane's."""
