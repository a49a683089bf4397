"""Prometheus metrics of a consumer rank (one registry per rank)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stoker.accel.control.metrics import ControlMetrics

STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ConsumerMetrics(ControlMetrics):
    """The consumer's own metrics, beside the control plane's (rank 0 runs the dispatcher in-process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self.samples = Counter("stoker_consumer_samples", "Rows consumed by training steps (images, or rows of tokens)",
                               registry=r)
        self.job = Gauge("stoker_consumer_job_info", "1, labelled with whose endpoint this is: the job, the rank "
                         "and the consumer's process", ["job_id", "dataset", "rank", "pid"], registry=r)
        self.batches = Counter("stoker_consumer_batches", "Batches consumed by training steps", registry=r)
        self.sequences = Counter("stoker_consumer_sequences", "Text: BERT examples consumed by training steps",
                                 registry=r)
        self.tokens = Counter("stoker_consumer_tokens", "Text: non-padding tokens consumed by training steps",
                              registry=r)
        self.padding = Gauge("stoker_consumer_padding_fraction",
                             "Text: share of token slots that are padding, one sequence per row (packing=before) "
                             "and as received (packing=after), over the job so far", ["packing"], registry=r)
        self.bytes_received = Counter("stoker_consumer_bytes_received", "Tensor bytes received", registry=r)
        self.host_rows = Counter("stoker_consumer_host_rows", "Rows received, by the worker host that made them "
                                 "(hosts that proved a lease)", ["host"], registry=r)
        self.host_credit_wait = Counter("stoker_consumer_host_credit_wait_seconds", "Seconds the host's processes "
                                        "waited for credit before the batches they sent here", ["host"], registry=r)
        self.host_cpu = Counter("stoker_consumer_host_cpu_seconds", "CPU seconds the host's worker processes spent "
                                "making the batches they sent here (every thread: their whole cost)", ["host"],
                                registry=r)
        self.host_cpu_wait = Counter("stoker_consumer_host_cpu_wait_seconds", "Seconds the host's worker processes "
                                     "were runnable without a core while making the batches they sent here "
                                     "(schedstat run delay: other processes or a CPU quota took the CPU)", ["host"],
                                     registry=r)
        self.duplicates = Counter("stoker_consumer_duplicates_dropped",
                                  "Samples dropped because their batch was already delivered", registry=r)
        self.frames_dropped = Counter("stoker_consumer_frames_dropped",
                                      "Messages dropped as malformed or unauthorised", ["reason"], registry=r)
        self.skipped = Counter("stoker_consumer_samples_skipped",
                               "Samples skipped as unusable: reported by the workers in batch headers, or whose "
                               "JPEG failed to decode on the consumer (--decode-on accelerator)", registry=r)
        self.step_seconds = Histogram("stoker_consumer_step_seconds", "Compute time per training step",
                                      buckets=STEP_BUCKETS, registry=r)
        self.input_wait = Histogram("stoker_consumer_input_wait_seconds",
                                    "Time a step waited for its batch (stall)", buckets=STEP_BUCKETS, registry=r)
        self.device_copy = Histogram("stoker_consumer_device_copy_seconds",
                                     "Host-to-device copy time per batch", buckets=STEP_BUCKETS, registry=r)
        self.accel_decode = Histogram("stoker_consumer_decode_seconds",
                                      "--decode-on accelerator: JPEG decode time per batch on the consumer",
                                      buckets=STEP_BUCKETS, registry=r)
        self.accel_decode_errors = Counter("stoker_consumer_decode_errors",
                                           "--decode-on accelerator: samples whose JPEG failed to decode "
                                           "on the consumer (dropped from their batch)", registry=r)
        self.accel_decode_fallbacks = Counter("stoker_consumer_decode_fallbacks",
                                              "--decode-on accelerator: samples DALI refused that the consumer "
                                              "decoded on its CPU instead", registry=r)
        self.queue_depth = Gauge("stoker_consumer_queue_depth", "Batches waiting in the prefetch queue",
                                 registry=r)
        self.senders = Gauge("stoker_consumer_senders", "Worker processes holding a credit window", registry=r)
        self.senders_freed = Counter("stoker_consumer_senders_freed",
                                     "Sender slots freed: the sender said bye, went silent past the sender timeout, "
                                     "could not be reached, or reconnected under a new routing id",
                                     ["reason"], registry=r)
