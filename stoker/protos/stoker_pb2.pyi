from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FrameSpec(_message.Message):
    __slots__ = ("tensor", "dtype", "shape", "nbytes")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    tensor: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    def __init__(self, tensor: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ...) -> None: ...

class StageSeconds(_message.Message):
    __slots__ = ("decode", "augment", "wait_for_credit", "send", "examples", "pack", "read", "read_wait", "cpu", "cpu_wait", "cpu_wait_measured", "throttled", "cores", "processes", "machine", "machine_cores")
    DECODE_FIELD_NUMBER: _ClassVar[int]
    AUGMENT_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_CREDIT_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    PACK_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    READ_WAIT_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    CPU_WAIT_FIELD_NUMBER: _ClassVar[int]
    CPU_WAIT_MEASURED_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    MACHINE_CORES_FIELD_NUMBER: _ClassVar[int]
    decode: float
    augment: float
    wait_for_credit: float
    send: float
    examples: float
    pack: float
    read: float
    read_wait: float
    cpu: float
    cpu_wait: float
    cpu_wait_measured: bool
    throttled: bool
    cores: float
    processes: int
    machine: str
    machine_cores: float
    def __init__(self, decode: _Optional[float] = ..., augment: _Optional[float] = ..., wait_for_credit: _Optional[float] = ..., send: _Optional[float] = ..., examples: _Optional[float] = ..., pack: _Optional[float] = ..., read: _Optional[float] = ..., read_wait: _Optional[float] = ..., cpu: _Optional[float] = ..., cpu_wait: _Optional[float] = ..., cpu_wait_measured: _Optional[bool] = ..., throttled: _Optional[bool] = ..., cores: _Optional[float] = ..., processes: _Optional[int] = ..., machine: _Optional[str] = ..., machine_cores: _Optional[float] = ...) -> None: ...

class TextStats(_message.Message):
    __slots__ = ("sequences", "real_tokens", "token_slots", "unpacked_token_slots", "masked_tokens", "random_next")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    REAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_SLOTS_FIELD_NUMBER: _ClassVar[int]
    UNPACKED_TOKEN_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MASKED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RANDOM_NEXT_FIELD_NUMBER: _ClassVar[int]
    sequences: int
    real_tokens: int
    token_slots: int
    unpacked_token_slots: int
    masked_tokens: int
    random_next: int
    def __init__(self, sequences: _Optional[int] = ..., real_tokens: _Optional[int] = ..., token_slots: _Optional[int] = ..., unpacked_token_slots: _Optional[int] = ..., masked_tokens: _Optional[int] = ..., random_next: _Optional[int] = ...) -> None: ...

class SkippedSample(_message.Message):
    __slots__ = ("sample_id", "key", "reason")
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sample_id: int
    key: str
    reason: str
    def __init__(self, sample_id: _Optional[int] = ..., key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class BatchHeader(_message.Message):
    __slots__ = ("job_id", "worker_id", "epoch", "unit_id", "batch_index", "last_in_unit", "sample_ids", "skipped", "frames", "has_crc32c", "crc32c", "created_unix", "stages", "rows", "text", "lease_token", "host_id", "unit_batches", "stepped_before")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_IN_UNIT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    HAS_CRC32C_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STEPPED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    worker_id: str
    epoch: int
    unit_id: int
    batch_index: int
    last_in_unit: bool
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    skipped: _containers.RepeatedCompositeFieldContainer[SkippedSample]
    frames: _containers.RepeatedCompositeFieldContainer[FrameSpec]
    has_crc32c: bool
    crc32c: int
    created_unix: float
    stages: StageSeconds
    rows: int
    text: TextStats
    lease_token: bytes
    host_id: str
    unit_batches: int
    stepped_before: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., epoch: _Optional[int] = ..., unit_id: _Optional[int] = ..., batch_index: _Optional[int] = ..., last_in_unit: _Optional[bool] = ..., sample_ids: _Optional[_Iterable[int]] = ..., skipped: _Optional[_Iterable[_Union[SkippedSample, _Mapping]]] = ..., frames: _Optional[_Iterable[_Union[FrameSpec, _Mapping]]] = ..., has_crc32c: _Optional[bool] = ..., crc32c: _Optional[int] = ..., created_unix: _Optional[float] = ..., stages: _Optional[_Union[StageSeconds, _Mapping]] = ..., rows: _Optional[int] = ..., text: _Optional[_Union[TextStats, _Mapping]] = ..., lease_token: _Optional[bytes] = ..., host_id: _Optional[str] = ..., unit_batches: _Optional[int] = ..., stepped_before: _Optional[_Iterable[int]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "job_id", "host_id", "unit_id", "lease_token")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    job_id: str
    host_id: str
    unit_id: int
    lease_token: bytes
    def __init__(self, worker_id: _Optional[str] = ..., job_id: _Optional[str] = ..., host_id: _Optional[str] = ..., unit_id: _Optional[int] = ..., lease_token: _Optional[bytes] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Bye(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DataMessage(_message.Message):
    __slots__ = ("hello", "batch", "bye", "pong")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    BYE_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    batch: BatchHeader
    bye: Bye
    pong: Pong
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., batch: _Optional[_Union[BatchHeader, _Mapping]] = ..., bye: _Optional[_Union[Bye, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: int
    def __init__(self, batches: _Optional[int] = ...) -> None: ...

class Reject(_message.Message):
    __slots__ = ("reason", "code", "unit_id")
    REASON_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    code: str
    unit_id: int
    def __init__(self, reason: _Optional[str] = ..., code: _Optional[str] = ..., unit_id: _Optional[int] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DataReply(_message.Message):
    __slots__ = ("credit", "reject", "ping")
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    REJECT_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    credit: Credit
    reject: Reject
    ping: Ping
    def __init__(self, credit: _Optional[_Union[Credit, _Mapping]] = ..., reject: _Optional[_Union[Reject, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("host_id", "procs", "pid")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PROCS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    procs: int
    pid: int
    def __init__(self, host_id: _Optional[str] = ..., procs: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("job_id", "manifest_uri", "data_endpoint", "batch_size", "image_size", "transform", "seed", "min_area", "max_area", "heartbeat_s", "checksum", "dataset", "text", "decoder", "epochs", "unit_batches", "decode_on", "world_size", "drop_last", "resumed_from", "transform_params", "transform_version", "transform_timeout_s", "corrupt_jpegs", "lm")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_URI_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_AREA_FIELD_NUMBER: _ClassVar[int]
    MAX_AREA_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DECODER_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    UNIT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    DECODE_ON_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DROP_LAST_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_JPEGS_FIELD_NUMBER: _ClassVar[int]
    LM_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    manifest_uri: str
    data_endpoint: str
    batch_size: int
    image_size: int
    transform: str
    seed: int
    min_area: float
    max_area: float
    heartbeat_s: float
    checksum: bool
    dataset: str
    text: TextSpec
    decoder: str
    epochs: int
    unit_batches: int
    decode_on: str
    world_size: int
    drop_last: bool
    resumed_from: str
    transform_params: str
    transform_version: str
    transform_timeout_s: float
    corrupt_jpegs: str
    lm: LMSpec
    def __init__(self, job_id: _Optional[str] = ..., manifest_uri: _Optional[str] = ..., data_endpoint: _Optional[str] = ..., batch_size: _Optional[int] = ..., image_size: _Optional[int] = ..., transform: _Optional[str] = ..., seed: _Optional[int] = ..., min_area: _Optional[float] = ..., max_area: _Optional[float] = ..., heartbeat_s: _Optional[float] = ..., checksum: _Optional[bool] = ..., dataset: _Optional[str] = ..., text: _Optional[_Union[TextSpec, _Mapping]] = ..., decoder: _Optional[str] = ..., epochs: _Optional[int] = ..., unit_batches: _Optional[int] = ..., decode_on: _Optional[str] = ..., world_size: _Optional[int] = ..., drop_last: _Optional[bool] = ..., resumed_from: _Optional[str] = ..., transform_params: _Optional[str] = ..., transform_version: _Optional[str] = ..., transform_timeout_s: _Optional[float] = ..., corrupt_jpegs: _Optional[str] = ..., lm: _Optional[_Union[LMSpec, _Mapping]] = ...) -> None: ...

class LMSpec(_message.Message):
    __slots__ = ("seq_len", "mode")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    mode: str
    def __init__(self, seq_len: _Optional[int] = ..., mode: _Optional[str] = ...) -> None: ...

class TextSpec(_message.Message):
    __slots__ = ("seq_len", "max_predictions", "masked_lm_prob", "short_seq_prob", "whole_word_mask", "pack", "pack_max_sequences")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    MASKED_LM_PROB_FIELD_NUMBER: _ClassVar[int]
    SHORT_SEQ_PROB_FIELD_NUMBER: _ClassVar[int]
    WHOLE_WORD_MASK_FIELD_NUMBER: _ClassVar[int]
    PACK_FIELD_NUMBER: _ClassVar[int]
    PACK_MAX_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    max_predictions: int
    masked_lm_prob: float
    short_seq_prob: float
    whole_word_mask: bool
    pack: bool
    pack_max_sequences: int
    def __init__(self, seq_len: _Optional[int] = ..., max_predictions: _Optional[int] = ..., masked_lm_prob: _Optional[float] = ..., short_seq_prob: _Optional[float] = ..., whole_word_mask: _Optional[bool] = ..., pack: _Optional[bool] = ..., pack_max_sequences: _Optional[int] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("job", "run_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    job: JobSpec
    run_id: str
    def __init__(self, job: _Optional[_Union[JobSpec, _Mapping]] = ..., run_id: _Optional[str] = ...) -> None: ...

class Attached(_message.Message):
    __slots__ = ("job", "lease_key")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LEASE_KEY_FIELD_NUMBER: _ClassVar[int]
    job: JobSpec
    lease_key: bytes
    def __init__(self, job: _Optional[_Union[JobSpec, _Mapping]] = ..., lease_key: _Optional[bytes] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("host_id", "worker_ids", "job_id", "run_id", "activity")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    run_id: str
    activity: _containers.RepeatedCompositeFieldContainer[ProcessActivity]
    def __init__(self, host_id: _Optional[str] = ..., worker_ids: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ..., run_id: _Optional[str] = ..., activity: _Optional[_Iterable[_Union[ProcessActivity, _Mapping]]] = ...) -> None: ...

class ProcessActivity(_message.Message):
    __slots__ = ("worker_id", "phase", "unit_id", "sample_id", "for_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    FOR_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    phase: str
    unit_id: int
    sample_id: int
    for_s: float
    def __init__(self, worker_id: _Optional[str] = ..., phase: _Optional[str] = ..., unit_id: _Optional[int] = ..., sample_id: _Optional[int] = ..., for_s: _Optional[float] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("host_id", "worker_id", "holding", "job_id", "run_id")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDING_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    worker_id: str
    holding: _containers.RepeatedScalarFieldContainer[int]
    job_id: str
    run_id: str
    def __init__(self, host_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., holding: _Optional[_Iterable[int]] = ..., job_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("shard_index", "start", "stop", "first_sample_id")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    FIRST_SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    start: int
    stop: int
    first_sample_id: int
    def __init__(self, shard_index: _Optional[int] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., first_sample_id: _Optional[int] = ...) -> None: ...

class WorkUnit(_message.Message):
    __slots__ = ("unit_id", "epoch", "lease_token", "segments", "rank", "position", "data_endpoint", "skip", "skip_batches")
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    SKIP_BATCHES_FIELD_NUMBER: _ClassVar[int]
    unit_id: int
    epoch: int
    lease_token: bytes
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    rank: int
    position: int
    data_endpoint: str
    skip: _containers.RepeatedCompositeFieldContainer[SkippedSample]
    skip_batches: int
    def __init__(self, unit_id: _Optional[int] = ..., epoch: _Optional[int] = ..., lease_token: _Optional[bytes] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., rank: _Optional[int] = ..., position: _Optional[int] = ..., data_endpoint: _Optional[str] = ..., skip: _Optional[_Iterable[_Union[SkippedSample, _Mapping]]] = ..., skip_batches: _Optional[int] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("host_id", "worker_ids", "reason", "unit_ids", "run_id", "crashed_sample")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UNIT_IDS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CRASHED_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    unit_ids: _containers.RepeatedScalarFieldContainer[int]
    run_id: str
    crashed_sample: int
    def __init__(self, host_id: _Optional[str] = ..., worker_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., unit_ids: _Optional[_Iterable[int]] = ..., run_id: _Optional[str] = ..., crashed_sample: _Optional[int] = ...) -> None: ...

class SampleHung(_message.Message):
    __slots__ = ("host_id", "worker_id", "unit_id", "sample_id", "seconds", "stuck", "run_id")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    UNIT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_ID_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STUCK_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    worker_id: str
    unit_id: int
    sample_id: int
    seconds: float
    stuck: bool
    run_id: str
    def __init__(self, host_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., unit_id: _Optional[int] = ..., sample_id: _Optional[int] = ..., seconds: _Optional[float] = ..., stuck: _Optional[bool] = ..., run_id: _Optional[str] = ...) -> None: ...

class PoisonQuery(_message.Message):
    __slots__ = ("unit_ids",)
    UNIT_IDS_FIELD_NUMBER: _ClassVar[int]
    unit_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, unit_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Skips(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[SkippedSample]
    def __init__(self, samples: _Optional[_Iterable[_Union[SkippedSample, _Mapping]]] = ...) -> None: ...

class Attach(_message.Message):
    __slots__ = ("consumer_id", "rank", "data_endpoint", "world_size", "start")
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    consumer_id: str
    rank: int
    data_endpoint: str
    world_size: int
    start: StartPosition
    def __init__(self, consumer_id: _Optional[str] = ..., rank: _Optional[int] = ..., data_endpoint: _Optional[str] = ..., world_size: _Optional[int] = ..., start: _Optional[_Union[StartPosition, _Mapping]] = ...) -> None: ...

class StartPosition(_message.Message):
    __slots__ = ("epoch", "step", "units", "batches")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    step: int
    units: int
    batches: int
    def __init__(self, epoch: _Optional[int] = ..., step: _Optional[int] = ..., units: _Optional[int] = ..., batches: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("unit_ids", "batches", "received", "redo", "waiting_s", "need", "counted_units", "counted_batches")
    UNIT_IDS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    REDO_FIELD_NUMBER: _ClassVar[int]
    WAITING_S_FIELD_NUMBER: _ClassVar[int]
    NEED_FIELD_NUMBER: _ClassVar[int]
    COUNTED_UNITS_FIELD_NUMBER: _ClassVar[int]
    COUNTED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    unit_ids: _containers.RepeatedScalarFieldContainer[int]
    batches: _containers.RepeatedScalarFieldContainer[int]
    received: _containers.RepeatedScalarFieldContainer[int]
    redo: _containers.RepeatedScalarFieldContainer[int]
    waiting_s: float
    need: RankNeed
    counted_units: _containers.RepeatedScalarFieldContainer[int]
    counted_batches: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, unit_ids: _Optional[_Iterable[int]] = ..., batches: _Optional[_Iterable[int]] = ..., received: _Optional[_Iterable[int]] = ..., redo: _Optional[_Iterable[int]] = ..., waiting_s: _Optional[float] = ..., need: _Optional[_Union[RankNeed, _Mapping]] = ..., counted_units: _Optional[_Iterable[int]] = ..., counted_batches: _Optional[_Iterable[int]] = ...) -> None: ...

class RankNeed(_message.Message):
    __slots__ = ("measured", "cores_needed", "stall_fraction", "cores_in_use", "stage")
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    CORES_NEEDED_FIELD_NUMBER: _ClassVar[int]
    STALL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CORES_IN_USE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    measured: bool
    cores_needed: float
    stall_fraction: float
    cores_in_use: float
    stage: str
    def __init__(self, measured: _Optional[bool] = ..., cores_needed: _Optional[float] = ..., stall_fraction: _Optional[float] = ..., cores_in_use: _Optional[float] = ..., stage: _Optional[str] = ...) -> None: ...

class EpochSteps(_message.Message):
    __slots__ = ("epoch", "rank", "batches")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    rank: int
    batches: int
    def __init__(self, epoch: _Optional[int] = ..., rank: _Optional[int] = ..., batches: _Optional[int] = ...) -> None: ...

class PositionQuery(_message.Message):
    __slots__ = ("epoch", "step")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    step: int
    def __init__(self, epoch: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class ControlRequest(_message.Message):
    __slots__ = ("request_id", "register", "heartbeat", "lease", "release", "attach", "ack", "epoch_steps", "position", "refuse", "hung", "poison", "job_credential")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_STEPS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REFUSE_FIELD_NUMBER: _ClassVar[int]
    HUNG_FIELD_NUMBER: _ClassVar[int]
    POISON_FIELD_NUMBER: _ClassVar[int]
    JOB_CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    register: Register
    heartbeat: Heartbeat
    lease: LeaseRequest
    release: Release
    attach: Attach
    ack: Ack
    epoch_steps: EpochSteps
    position: PositionQuery
    refuse: Refusal
    hung: SampleHung
    poison: PoisonQuery
    job_credential: bytes
    def __init__(self, request_id: _Optional[int] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., lease: _Optional[_Union[LeaseRequest, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., attach: _Optional[_Union[Attach, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., epoch_steps: _Optional[_Union[EpochSteps, _Mapping]] = ..., position: _Optional[_Union[PositionQuery, _Mapping]] = ..., refuse: _Optional[_Union[Refusal, _Mapping]] = ..., hung: _Optional[_Union[SampleHung, _Mapping]] = ..., poison: _Optional[_Union[PoisonQuery, _Mapping]] = ..., job_credential: _Optional[bytes] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("host_id", "worker_id", "job_id", "reason")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    worker_id: str
    job_id: str
    reason: str
    def __init__(self, host_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Wait(_message.Message):
    __slots__ = ("retry_after_s",)
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    retry_after_s: float
    def __init__(self, retry_after_s: _Optional[float] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class OtherJob(_message.Message):
    __slots__ = ("job_id", "run_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    run_id: str
    def __init__(self, job_id: _Optional[str] = ..., run_id: _Optional[str] = ...) -> None: ...

class Steps(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    def __init__(self, steps: _Optional[int] = ...) -> None: ...

class RankPosition(_message.Message):
    __slots__ = ("units", "batches", "unsure", "split")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    UNSURE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    units: int
    batches: int
    unsure: bool
    split: bool
    def __init__(self, units: _Optional[int] = ..., batches: _Optional[int] = ..., unsure: _Optional[bool] = ..., split: _Optional[bool] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("ranks",)
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedCompositeFieldContainer[RankPosition]
    def __init__(self, ranks: _Optional[_Iterable[_Union[RankPosition, _Mapping]]] = ...) -> None: ...

class Ok(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Error(_message.Message):
    __slots__ = ("message", "reason")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    message: str
    reason: str
    def __init__(self, message: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ("request_id", "registered", "unit", "wait", "finished", "ok", "error", "attached", "steps", "position", "other_job", "skips", "stats")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    OTHER_JOB_FIELD_NUMBER: _ClassVar[int]
    SKIPS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    registered: Registered
    unit: WorkUnit
    wait: Wait
    finished: Finished
    ok: Ok
    error: Error
    attached: Attached
    steps: Steps
    position: Position
    other_job: OtherJob
    skips: Skips
    stats: JobStats
    def __init__(self, request_id: _Optional[int] = ..., registered: _Optional[_Union[Registered, _Mapping]] = ..., unit: _Optional[_Union[WorkUnit, _Mapping]] = ..., wait: _Optional[_Union[Wait, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., ok: _Optional[_Union[Ok, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., attached: _Optional[_Union[Attached, _Mapping]] = ..., steps: _Optional[_Union[Steps, _Mapping]] = ..., position: _Optional[_Union[Position, _Mapping]] = ..., other_job: _Optional[_Union[OtherJob, _Mapping]] = ..., skips: _Optional[_Union[Skips, _Mapping]] = ..., stats: _Optional[_Union[JobStats, _Mapping]] = ...) -> None: ...

class JobStats(_message.Message):
    __slots__ = ("pending", "leased", "done", "hosts_alive", "releases", "handed_back", "failure", "stall", "hung_samples", "hung_s")
    PENDING_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_ALIVE_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    HANDED_BACK_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    STALL_FIELD_NUMBER: _ClassVar[int]
    HUNG_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    HUNG_S_FIELD_NUMBER: _ClassVar[int]
    pending: int
    leased: int
    done: int
    hosts_alive: int
    releases: int
    handed_back: int
    failure: str
    stall: str
    hung_samples: int
    hung_s: float
    def __init__(self, pending: _Optional[int] = ..., leased: _Optional[int] = ..., done: _Optional[int] = ..., hosts_alive: _Optional[int] = ..., releases: _Optional[int] = ..., handed_back: _Optional[int] = ..., failure: _Optional[str] = ..., stall: _Optional[str] = ..., hung_samples: _Optional[int] = ..., hung_s: _Optional[float] = ...) -> None: ...

class FleetJobProcs(_message.Message):
    __slots__ = ("job_id", "endpoint", "procs")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PROCS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    endpoint: str
    procs: int
    def __init__(self, job_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., procs: _Optional[int] = ...) -> None: ...

class FleetHost(_message.Message):
    __slots__ = ("host_id", "procs", "pid", "serving", "leaving", "cores")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PROCS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    procs: int
    pid: int
    serving: _containers.RepeatedCompositeFieldContainer[FleetJobProcs]
    leaving: bool
    cores: float
    def __init__(self, host_id: _Optional[str] = ..., procs: _Optional[int] = ..., pid: _Optional[int] = ..., serving: _Optional[_Iterable[_Union[FleetJobProcs, _Mapping]]] = ..., leaving: _Optional[bool] = ..., cores: _Optional[float] = ...) -> None: ...

class FleetJob(_message.Message):
    __slots__ = ("job_id", "endpoint", "weight", "min_cores", "max_cores", "want_cores", "want_reason", "stall_fraction", "cores_needed", "cores_in_use", "leaving", "transform", "stage")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    MIN_CORES_FIELD_NUMBER: _ClassVar[int]
    MAX_CORES_FIELD_NUMBER: _ClassVar[int]
    WANT_CORES_FIELD_NUMBER: _ClassVar[int]
    WANT_REASON_FIELD_NUMBER: _ClassVar[int]
    STALL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CORES_NEEDED_FIELD_NUMBER: _ClassVar[int]
    CORES_IN_USE_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    endpoint: str
    weight: float
    min_cores: int
    max_cores: int
    want_cores: float
    want_reason: str
    stall_fraction: float
    cores_needed: float
    cores_in_use: float
    leaving: bool
    transform: str
    stage: str
    def __init__(self, job_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., weight: _Optional[float] = ..., min_cores: _Optional[int] = ..., max_cores: _Optional[int] = ..., want_cores: _Optional[float] = ..., want_reason: _Optional[str] = ..., stall_fraction: _Optional[float] = ..., cores_needed: _Optional[float] = ..., cores_in_use: _Optional[float] = ..., leaving: _Optional[bool] = ..., transform: _Optional[str] = ..., stage: _Optional[str] = ...) -> None: ...

class FleetPlan(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[FleetJobProcs]
    def __init__(self, jobs: _Optional[_Iterable[_Union[FleetJobProcs, _Mapping]]] = ...) -> None: ...

class FleetShare(_message.Message):
    __slots__ = ("target", "holding", "missing", "fleet_procs", "hosts", "reason")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    HOLDING_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    FLEET_PROCS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    target: int
    holding: int
    missing: int
    fleet_procs: int
    hosts: int
    reason: str
    def __init__(self, target: _Optional[int] = ..., holding: _Optional[int] = ..., missing: _Optional[int] = ..., fleet_procs: _Optional[int] = ..., hosts: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class FleetRequest(_message.Message):
    __slots__ = ("request_id", "fleet_host", "fleet_job")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FLEET_HOST_FIELD_NUMBER: _ClassVar[int]
    FLEET_JOB_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    fleet_host: FleetHost
    fleet_job: FleetJob
    def __init__(self, request_id: _Optional[int] = ..., fleet_host: _Optional[_Union[FleetHost, _Mapping]] = ..., fleet_job: _Optional[_Union[FleetJob, _Mapping]] = ...) -> None: ...

class FleetReply(_message.Message):
    __slots__ = ("request_id", "error", "fleet_plan", "fleet_share")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FLEET_PLAN_FIELD_NUMBER: _ClassVar[int]
    FLEET_SHARE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: Error
    fleet_plan: FleetPlan
    fleet_share: FleetShare
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., fleet_plan: _Optional[_Union[FleetPlan, _Mapping]] = ..., fleet_share: _Optional[_Union[FleetShare, _Mapping]] = ...) -> None: ...
