import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from shared.proto.apprentice.v1 import common_pb2 as _common_pb2
from shared.proto.apprentice.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VersionStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERSION_STATUS_UNSPECIFIED: _ClassVar[VersionStatus]
    VERSION_STATUS_CANDIDATE: _ClassVar[VersionStatus]
    VERSION_STATUS_APPROVED: _ClassVar[VersionStatus]
    VERSION_STATUS_REJECTED: _ClassVar[VersionStatus]
    VERSION_STATUS_CANARY: _ClassVar[VersionStatus]
    VERSION_STATUS_PROMOTED: _ClassVar[VersionStatus]
    VERSION_STATUS_RETIRED: _ClassVar[VersionStatus]
    VERSION_STATUS_ROLLED_BACK: _ClassVar[VersionStatus]
VERSION_STATUS_UNSPECIFIED: VersionStatus
VERSION_STATUS_CANDIDATE: VersionStatus
VERSION_STATUS_APPROVED: VersionStatus
VERSION_STATUS_REJECTED: VersionStatus
VERSION_STATUS_CANARY: VersionStatus
VERSION_STATUS_PROMOTED: VersionStatus
VERSION_STATUS_RETIRED: VersionStatus
VERSION_STATUS_ROLLED_BACK: VersionStatus

class FileEntry(_message.Message):
    __slots__ = ("path", "size", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class EvalResult(_message.Message):
    __slots__ = ("suite", "metric", "candidate", "baseline", "threshold", "passed", "detail", "baseline_version", "comparison")
    SUITE_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    BASELINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPARISON_FIELD_NUMBER: _ClassVar[int]
    suite: str
    metric: str
    candidate: float
    baseline: float
    threshold: float
    passed: bool
    detail: str
    baseline_version: str
    comparison: str
    def __init__(self, suite: _Optional[str] = ..., metric: _Optional[str] = ..., candidate: _Optional[float] = ..., baseline: _Optional[float] = ..., threshold: _Optional[float] = ..., passed: _Optional[bool] = ..., detail: _Optional[str] = ..., baseline_version: _Optional[str] = ..., comparison: _Optional[str] = ...) -> None: ...

class Manifest(_message.Message):
    __slots__ = ("model", "version", "base_model", "parent_version", "kind", "files", "training_metadata", "data_offsets", "algorithm", "train_metrics", "eval_results", "status", "status_reason", "created_at", "pinned", "tenant", "base_version")
    class TrainingMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TrainMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TRAINING_METADATA_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    TRAIN_METRICS_FIELD_NUMBER: _ClassVar[int]
    EVAL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    base_model: str
    parent_version: str
    kind: str
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    training_metadata: _containers.ScalarMap[str, str]
    data_offsets: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicOffsets]
    algorithm: str
    train_metrics: _containers.ScalarMap[str, float]
    eval_results: _containers.RepeatedCompositeFieldContainer[EvalResult]
    status: VersionStatus
    status_reason: str
    created_at: _timestamp_pb2.Timestamp
    pinned: bool
    tenant: str
    base_version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., base_model: _Optional[str] = ..., parent_version: _Optional[str] = ..., kind: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ..., training_metadata: _Optional[_Mapping[str, str]] = ..., data_offsets: _Optional[_Iterable[_Union[_common_pb2.TopicOffsets, _Mapping]]] = ..., algorithm: _Optional[str] = ..., train_metrics: _Optional[_Mapping[str, float]] = ..., eval_results: _Optional[_Iterable[_Union[EvalResult, _Mapping]]] = ..., status: _Optional[_Union[VersionStatus, str]] = ..., status_reason: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pinned: _Optional[bool] = ..., tenant: _Optional[str] = ..., base_version: _Optional[str] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("model", "version", "parent_version", "kind", "base_model", "files", "training_metadata", "data_offsets", "algorithm", "train_metrics", "tenant", "base_version")
    class TrainingMetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TrainMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    TRAINING_METADATA_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    TRAIN_METRICS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    parent_version: str
    kind: str
    base_model: str
    files: _containers.RepeatedCompositeFieldContainer[FileEntry]
    training_metadata: _containers.ScalarMap[str, str]
    data_offsets: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicOffsets]
    algorithm: str
    train_metrics: _containers.ScalarMap[str, float]
    tenant: str
    base_version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., parent_version: _Optional[str] = ..., kind: _Optional[str] = ..., base_model: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileEntry, _Mapping]]] = ..., training_metadata: _Optional[_Mapping[str, str]] = ..., data_offsets: _Optional[_Iterable[_Union[_common_pb2.TopicOffsets, _Mapping]]] = ..., algorithm: _Optional[str] = ..., train_metrics: _Optional[_Mapping[str, float]] = ..., tenant: _Optional[str] = ..., base_version: _Optional[str] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("path", "offset", "data")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    data: bytes
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    chunk: FileChunk
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., chunk: _Optional[_Union[FileChunk, _Mapping]] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("model", "version", "path", "offset", "chunk_size", "length")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    path: str
    offset: int
    chunk_size: int
    length: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., path: _Optional[str] = ..., offset: _Optional[int] = ..., chunk_size: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class DownloadChunk(_message.Message):
    __slots__ = ("path", "offset", "data", "file_size", "file_sha256", "manifest")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILE_SHA256_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    data: bytes
    file_size: int
    file_sha256: str
    manifest: Manifest
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., file_size: _Optional[int] = ..., file_sha256: _Optional[str] = ..., manifest: _Optional[_Union[Manifest, _Mapping]] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[Manifest]
    def __init__(self, versions: _Optional[_Iterable[_Union[Manifest, _Mapping]]] = ...) -> None: ...

class GetVersionRequest(_message.Message):
    __slots__ = ("model", "version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("model", "version", "force", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    force: bool
    reason: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., force: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class CanaryRequest(_message.Message):
    __slots__ = ("model", "version", "fraction", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    fraction: float
    reason: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., fraction: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("model", "version", "reason", "tenant")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    reason: str
    tenant: str
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., reason: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class OrderAck(_message.Message):
    __slots__ = ("order_id", "model", "version", "action")
    ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    order_id: str
    model: str
    version: str
    action: str
    def __init__(self, order_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., action: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class PodHeartbeat(_message.Message):
    __slots__ = ("pod_id", "model", "serving_version", "canary_version", "canary_fraction", "endpoint", "last_error", "sent_at", "tenant_versions", "tenant_canaries", "canary_requests", "canary_errors")
    class TenantVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TenantCanariesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POD_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SERVING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    TENANT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TENANT_CANARIES_FIELD_NUMBER: _ClassVar[int]
    CANARY_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CANARY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    pod_id: str
    model: str
    serving_version: str
    canary_version: str
    canary_fraction: float
    endpoint: str
    last_error: str
    sent_at: _timestamp_pb2.Timestamp
    tenant_versions: _containers.ScalarMap[str, str]
    tenant_canaries: _containers.ScalarMap[str, str]
    canary_requests: int
    canary_errors: int
    def __init__(self, pod_id: _Optional[str] = ..., model: _Optional[str] = ..., serving_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., canary_fraction: _Optional[float] = ..., endpoint: _Optional[str] = ..., last_error: _Optional[str] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tenant_versions: _Optional[_Mapping[str, str]] = ..., tenant_canaries: _Optional[_Mapping[str, str]] = ..., canary_requests: _Optional[int] = ..., canary_errors: _Optional[int] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("promoted_version", "desired")
    PROMOTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    promoted_version: str
    desired: _containers.RepeatedCompositeFieldContainer[_events_pb2.ModelUpdate]
    def __init__(self, promoted_version: _Optional[str] = ..., desired: _Optional[_Iterable[_Union[_events_pb2.ModelUpdate, _Mapping]]] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("model", "version", "pinned")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    pinned: bool
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., pinned: _Optional[bool] = ...) -> None: ...

class PodStatus(_message.Message):
    __slots__ = ("pod_id", "serving_version", "canary_version", "last_heartbeat", "converged", "lagging", "last_error", "endpoint", "tenant_versions", "tenant_canaries", "canary_requests", "canary_errors", "detail", "heartbeat_age_s")
    class TenantVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TenantCanariesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POD_ID_FIELD_NUMBER: _ClassVar[int]
    SERVING_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    LAGGING_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TENANT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TENANT_CANARIES_FIELD_NUMBER: _ClassVar[int]
    CANARY_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CANARY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    pod_id: str
    serving_version: str
    canary_version: str
    last_heartbeat: _timestamp_pb2.Timestamp
    converged: bool
    lagging: bool
    last_error: str
    endpoint: str
    tenant_versions: _containers.ScalarMap[str, str]
    tenant_canaries: _containers.ScalarMap[str, str]
    canary_requests: int
    canary_errors: int
    detail: str
    heartbeat_age_s: float
    def __init__(self, pod_id: _Optional[str] = ..., serving_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., last_heartbeat: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., converged: _Optional[bool] = ..., lagging: _Optional[bool] = ..., last_error: _Optional[str] = ..., endpoint: _Optional[str] = ..., tenant_versions: _Optional[_Mapping[str, str]] = ..., tenant_canaries: _Optional[_Mapping[str, str]] = ..., canary_requests: _Optional[int] = ..., canary_errors: _Optional[int] = ..., detail: _Optional[str] = ..., heartbeat_age_s: _Optional[float] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("model", "promoted_version", "canary_version", "canary_fraction", "pods", "converged", "tenant_versions", "tenant_canaries", "canary_healthy_requests", "last_order_at", "last_order_id", "lagging_pods")
    class TenantVersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class TenantCanariesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    TENANT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TENANT_CANARIES_FIELD_NUMBER: _ClassVar[int]
    CANARY_HEALTHY_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ORDER_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ORDER_ID_FIELD_NUMBER: _ClassVar[int]
    LAGGING_PODS_FIELD_NUMBER: _ClassVar[int]
    model: str
    promoted_version: str
    canary_version: str
    canary_fraction: float
    pods: _containers.RepeatedCompositeFieldContainer[PodStatus]
    converged: bool
    tenant_versions: _containers.ScalarMap[str, str]
    tenant_canaries: _containers.ScalarMap[str, str]
    canary_healthy_requests: int
    last_order_at: _timestamp_pb2.Timestamp
    last_order_id: str
    lagging_pods: int
    def __init__(self, model: _Optional[str] = ..., promoted_version: _Optional[str] = ..., canary_version: _Optional[str] = ..., canary_fraction: _Optional[float] = ..., pods: _Optional[_Iterable[_Union[PodStatus, _Mapping]]] = ..., converged: _Optional[bool] = ..., tenant_versions: _Optional[_Mapping[str, str]] = ..., tenant_canaries: _Optional[_Mapping[str, str]] = ..., canary_healthy_requests: _Optional[int] = ..., last_order_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_order_id: _Optional[str] = ..., lagging_pods: _Optional[int] = ...) -> None: ...
