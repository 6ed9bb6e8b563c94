import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from shared.proto.apprentice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ItemStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ITEM_STATUS_UNSPECIFIED: _ClassVar[ItemStatus]
    ITEM_STATUS_PROPOSED: _ClassVar[ItemStatus]
    ITEM_STATUS_APPROVED: _ClassVar[ItemStatus]
    ITEM_STATUS_REJECTED: _ClassVar[ItemStatus]
    ITEM_STATUS_PINNED: _ClassVar[ItemStatus]
    ITEM_STATUS_CONSOLIDATED: _ClassVar[ItemStatus]
    ITEM_STATUS_RETIRED: _ClassVar[ItemStatus]

class UpdateAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_ACTION_UNSPECIFIED: _ClassVar[UpdateAction]
    UPDATE_ACTION_PROMOTE: _ClassVar[UpdateAction]
    UPDATE_ACTION_CANARY: _ClassVar[UpdateAction]
    UPDATE_ACTION_ROLLBACK: _ClassVar[UpdateAction]
ITEM_STATUS_UNSPECIFIED: ItemStatus
ITEM_STATUS_PROPOSED: ItemStatus
ITEM_STATUS_APPROVED: ItemStatus
ITEM_STATUS_REJECTED: ItemStatus
ITEM_STATUS_PINNED: ItemStatus
ITEM_STATUS_CONSOLIDATED: ItemStatus
ITEM_STATUS_RETIRED: ItemStatus
UPDATE_ACTION_UNSPECIFIED: UpdateAction
UPDATE_ACTION_PROMOTE: UpdateAction
UPDATE_ACTION_CANARY: UpdateAction
UPDATE_ACTION_ROLLBACK: UpdateAction

class Interaction(_message.Message):
    __slots__ = ("envelope", "interaction_id", "session_id", "task", "model", "policy_version", "knowledge_version", "messages", "prompt_text", "prompt_token_ids", "sampling", "response_text", "response_token_ids", "response_logprobs", "response_logprobs_t1", "finish_reason", "latency_ms", "group_id", "sample_index", "group_size", "canary", "serving_pod", "raw_prompt", "knowledge_items", "tools", "response_format", "response_tool_calls", "trajectory")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    KNOWLEDGE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_T1_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    SERVING_POD_FIELD_NUMBER: _ClassVar[int]
    RAW_PROMPT_FIELD_NUMBER: _ClassVar[int]
    KNOWLEDGE_ITEMS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    interaction_id: str
    session_id: str
    task: str
    model: str
    policy_version: str
    knowledge_version: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    prompt_text: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    response_text: str
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_logprobs: _containers.RepeatedScalarFieldContainer[float]
    response_logprobs_t1: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: str
    latency_ms: float
    group_id: str
    sample_index: int
    group_size: int
    canary: bool
    serving_pod: str
    raw_prompt: bool
    knowledge_items: _containers.RepeatedCompositeFieldContainer[KnowledgeRef]
    tools: _containers.RepeatedCompositeFieldContainer[_common_pb2.Tool]
    response_format: _common_pb2.ResponseFormat
    response_tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    trajectory: Trajectory
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., interaction_id: _Optional[str] = ..., session_id: _Optional[str] = ..., task: _Optional[str] = ..., model: _Optional[str] = ..., policy_version: _Optional[str] = ..., knowledge_version: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., prompt_text: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., response_text: _Optional[str] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., response_logprobs: _Optional[_Iterable[float]] = ..., response_logprobs_t1: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[str] = ..., latency_ms: _Optional[float] = ..., group_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., group_size: _Optional[int] = ..., canary: _Optional[bool] = ..., serving_pod: _Optional[str] = ..., raw_prompt: _Optional[bool] = ..., knowledge_items: _Optional[_Iterable[_Union[KnowledgeRef, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[_common_pb2.Tool, _Mapping]]] = ..., response_format: _Optional[_Union[_common_pb2.ResponseFormat, _Mapping]] = ..., response_tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("prompt_length", "environment", "logprobs", "logprobs_t1", "interaction_ids", "realigned_tokens")
    PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_T1_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_IDS_FIELD_NUMBER: _ClassVar[int]
    REALIGNED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_length: int
    environment: _containers.RepeatedScalarFieldContainer[bool]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    logprobs_t1: _containers.RepeatedScalarFieldContainer[float]
    interaction_ids: _containers.RepeatedScalarFieldContainer[str]
    realigned_tokens: int
    def __init__(self, prompt_length: _Optional[int] = ..., environment: _Optional[_Iterable[bool]] = ..., logprobs: _Optional[_Iterable[float]] = ..., logprobs_t1: _Optional[_Iterable[float]] = ..., interaction_ids: _Optional[_Iterable[str]] = ..., realigned_tokens: _Optional[int] = ...) -> None: ...

class KnowledgeRef(_message.Message):
    __slots__ = ("key", "item_id", "revision", "snapshot_version", "score")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    key: str
    item_id: str
    revision: int
    snapshot_version: int
    score: float
    def __init__(self, key: _Optional[str] = ..., item_id: _Optional[str] = ..., revision: _Optional[int] = ..., snapshot_version: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class FeedbackEvent(_message.Message):
    __slots__ = ("envelope", "interaction_id", "kind", "value", "comment", "kpi_name")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    KPI_NAME_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    interaction_id: str
    kind: str
    value: float
    comment: str
    kpi_name: str
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., interaction_id: _Optional[str] = ..., kind: _Optional[str] = ..., value: _Optional[float] = ..., comment: _Optional[str] = ..., kpi_name: _Optional[str] = ...) -> None: ...

class RewardComponent(_message.Message):
    __slots__ = ("name", "value", "weight", "has_signal", "detail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    HAS_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: float
    weight: float
    has_signal: bool
    detail: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[float] = ..., weight: _Optional[float] = ..., has_signal: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class GradedInteraction(_message.Message):
    __slots__ = ("envelope", "interaction", "revision", "reward", "has_signal", "components", "flags", "quarantined", "feedback", "no_signal_reason", "success", "grader_config_version")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    HAS_SIGNAL_FIELD_NUMBER: _ClassVar[int]
    COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    NO_SIGNAL_REASON_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    GRADER_CONFIG_VERSION_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    interaction: Interaction
    revision: int
    reward: float
    has_signal: bool
    components: _containers.RepeatedCompositeFieldContainer[RewardComponent]
    flags: _containers.RepeatedScalarFieldContainer[str]
    quarantined: bool
    feedback: _containers.RepeatedCompositeFieldContainer[FeedbackEvent]
    no_signal_reason: str
    success: bool
    grader_config_version: str
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., interaction: _Optional[_Union[Interaction, _Mapping]] = ..., revision: _Optional[int] = ..., reward: _Optional[float] = ..., has_signal: _Optional[bool] = ..., components: _Optional[_Iterable[_Union[RewardComponent, _Mapping]]] = ..., flags: _Optional[_Iterable[str]] = ..., quarantined: _Optional[bool] = ..., feedback: _Optional[_Iterable[_Union[FeedbackEvent, _Mapping]]] = ..., no_signal_reason: _Optional[str] = ..., success: _Optional[bool] = ..., grader_config_version: _Optional[str] = ...) -> None: ...

class KnowledgeItem(_message.Message):
    __slots__ = ("item_id", "text", "status", "source_interaction_ids", "created_at", "updated_at", "helpful", "harmful", "token_count", "created_by", "edited_by", "provenance", "screen_flags", "questions", "answer_terms", "revision", "retired_reason", "superseded_by", "consolidated_in", "lost_in")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_INTERACTION_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    HELPFUL_FIELD_NUMBER: _ClassVar[int]
    HARMFUL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    EDITED_BY_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    SCREEN_FLAGS_FIELD_NUMBER: _ClassVar[int]
    QUESTIONS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_TERMS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    RETIRED_REASON_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_BY_FIELD_NUMBER: _ClassVar[int]
    CONSOLIDATED_IN_FIELD_NUMBER: _ClassVar[int]
    LOST_IN_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    text: str
    status: ItemStatus
    source_interaction_ids: _containers.RepeatedScalarFieldContainer[str]
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    helpful: int
    harmful: int
    token_count: int
    created_by: str
    edited_by: str
    provenance: _containers.RepeatedCompositeFieldContainer[Provenance]
    screen_flags: _containers.RepeatedScalarFieldContainer[str]
    questions: _containers.RepeatedScalarFieldContainer[str]
    answer_terms: _containers.RepeatedScalarFieldContainer[str]
    revision: int
    retired_reason: str
    superseded_by: str
    consolidated_in: str
    lost_in: str
    def __init__(self, item_id: _Optional[str] = ..., text: _Optional[str] = ..., status: _Optional[_Union[ItemStatus, str]] = ..., source_interaction_ids: _Optional[_Iterable[str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., helpful: _Optional[int] = ..., harmful: _Optional[int] = ..., token_count: _Optional[int] = ..., created_by: _Optional[str] = ..., edited_by: _Optional[str] = ..., provenance: _Optional[_Iterable[_Union[Provenance, _Mapping]]] = ..., screen_flags: _Optional[_Iterable[str]] = ..., questions: _Optional[_Iterable[str]] = ..., answer_terms: _Optional[_Iterable[str]] = ..., revision: _Optional[int] = ..., retired_reason: _Optional[str] = ..., superseded_by: _Optional[str] = ..., consolidated_in: _Optional[str] = ..., lost_in: _Optional[str] = ...) -> None: ...

class Provenance(_message.Message):
    __slots__ = ("action", "principal", "tenant", "interaction_ids", "at", "source", "detail", "text", "other_item_id")
    ACTION_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_IDS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OTHER_ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    action: str
    principal: _common_pb2.Principal
    tenant: str
    interaction_ids: _containers.RepeatedScalarFieldContainer[str]
    at: _timestamp_pb2.Timestamp
    source: str
    detail: str
    text: str
    other_item_id: str
    def __init__(self, action: _Optional[str] = ..., principal: _Optional[_Union[_common_pb2.Principal, _Mapping]] = ..., tenant: _Optional[str] = ..., interaction_ids: _Optional[_Iterable[str]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[str] = ..., detail: _Optional[str] = ..., text: _Optional[str] = ..., other_item_id: _Optional[str] = ...) -> None: ...

class KnowledgeSnapshot(_message.Message):
    __slots__ = ("envelope", "key", "domain", "version", "items", "extractor_model", "extractor_policy_version", "require_approval", "change", "processed")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    EXTRACTOR_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    key: str
    domain: str
    version: int
    items: _containers.RepeatedCompositeFieldContainer[KnowledgeItem]
    extractor_model: str
    extractor_policy_version: str
    require_approval: bool
    change: str
    processed: _containers.RepeatedCompositeFieldContainer[ProcessedInteraction]
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., key: _Optional[str] = ..., domain: _Optional[str] = ..., version: _Optional[int] = ..., items: _Optional[_Iterable[_Union[KnowledgeItem, _Mapping]]] = ..., extractor_model: _Optional[str] = ..., extractor_policy_version: _Optional[str] = ..., require_approval: _Optional[bool] = ..., change: _Optional[str] = ..., processed: _Optional[_Iterable[_Union[ProcessedInteraction, _Mapping]]] = ...) -> None: ...

class ProcessedInteraction(_message.Message):
    __slots__ = ("interaction_id", "revision")
    INTERACTION_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    interaction_id: str
    revision: int
    def __init__(self, interaction_id: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class CheckpointPublished(_message.Message):
    __slots__ = ("envelope", "model", "version", "parent_version", "kind", "base_model", "algorithm", "data_offsets", "metrics", "manifest_sha256", "tenant")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    model: str
    version: str
    parent_version: str
    kind: str
    base_model: str
    algorithm: str
    data_offsets: _containers.RepeatedCompositeFieldContainer[_common_pb2.TopicOffsets]
    metrics: _containers.ScalarMap[str, float]
    manifest_sha256: str
    tenant: str
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., parent_version: _Optional[str] = ..., kind: _Optional[str] = ..., base_model: _Optional[str] = ..., algorithm: _Optional[str] = ..., data_offsets: _Optional[_Iterable[_Union[_common_pb2.TopicOffsets, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., manifest_sha256: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class ModelUpdate(_message.Message):
    __slots__ = ("envelope", "model", "action", "version", "canary_fraction", "previous_version", "kind", "base_version", "reason", "weights_endpoint", "tenant")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    model: str
    action: UpdateAction
    version: str
    canary_fraction: float
    previous_version: str
    kind: str
    base_version: str
    reason: str
    weights_endpoint: str
    tenant: str
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., model: _Optional[str] = ..., action: _Optional[_Union[UpdateAction, str]] = ..., version: _Optional[str] = ..., canary_fraction: _Optional[float] = ..., previous_version: _Optional[str] = ..., kind: _Optional[str] = ..., base_version: _Optional[str] = ..., reason: _Optional[str] = ..., weights_endpoint: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("envelope", "stage", "reason", "error_type", "origin_topic", "origin_partition", "origin_offset", "original_key", "original_value")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_TOPIC_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_PARTITION_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_KEY_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    stage: str
    reason: str
    error_type: str
    origin_topic: str
    origin_partition: int
    origin_offset: int
    original_key: bytes
    original_value: bytes
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., stage: _Optional[str] = ..., reason: _Optional[str] = ..., error_type: _Optional[str] = ..., origin_topic: _Optional[str] = ..., origin_partition: _Optional[int] = ..., origin_offset: _Optional[int] = ..., original_key: _Optional[bytes] = ..., original_value: _Optional[bytes] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("envelope", "action", "target", "allowed", "reason", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    envelope: _common_pb2.Envelope
    action: str
    target: str
    allowed: bool
    reason: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, envelope: _Optional[_Union[_common_pb2.Envelope, _Mapping]] = ..., action: _Optional[str] = ..., target: _Optional[str] = ..., allowed: _Optional[bool] = ..., reason: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...
