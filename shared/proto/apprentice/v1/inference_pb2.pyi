import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from shared.proto.apprentice.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("messages", "prompt", "sampling", "tenant", "session_id", "task", "no_capture", "no_knowledge", "tools", "tool_choice", "response_format", "no_parallel_tool_calls")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    NO_CAPTURE_FIELD_NUMBER: _ClassVar[int]
    NO_KNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    NO_PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    prompt: str
    sampling: _common_pb2.SamplingParams
    tenant: str
    session_id: str
    task: str
    no_capture: bool
    no_knowledge: bool
    tools: _containers.RepeatedCompositeFieldContainer[_common_pb2.Tool]
    tool_choice: _common_pb2.ToolChoice
    response_format: _common_pb2.ResponseFormat
    no_parallel_tool_calls: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., prompt: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., task: _Optional[str] = ..., no_capture: _Optional[bool] = ..., no_knowledge: _Optional[bool] = ..., tools: _Optional[_Iterable[_Union[_common_pb2.Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[_common_pb2.ToolChoice, _Mapping]] = ..., response_format: _Optional[_Union[_common_pb2.ResponseFormat, _Mapping]] = ..., no_parallel_tool_calls: _Optional[bool] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("interaction_id", "text", "finish_reason", "token_count", "index", "tool_calls")
    INTERACTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    interaction_id: str
    text: str
    finish_reason: str
    token_count: int
    index: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    def __init__(self, interaction_id: _Optional[str] = ..., text: _Optional[str] = ..., finish_reason: _Optional[str] = ..., token_count: _Optional[int] = ..., index: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("choices", "policy_version", "usage", "session_id")
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedCompositeFieldContainer[Choice]
    policy_version: str
    usage: Usage
    session_id: str
    def __init__(self, choices: _Optional[_Iterable[_Union[Choice, _Mapping]]] = ..., policy_version: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., session_id: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("index", "interaction_id", "text", "token_ids", "finish_reason", "policy_version", "usage", "session_id", "tool_calls")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    index: int
    interaction_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    policy_version: str
    usage: Usage
    session_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    def __init__(self, index: _Optional[int] = ..., interaction_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., policy_version: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., session_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ...) -> None: ...

class FeedbackRequest(_message.Message):
    __slots__ = ("interaction_id", "kind", "value", "comment", "kpi_name", "occurred_at", "tenant")
    INTERACTION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    COMMENT_FIELD_NUMBER: _ClassVar[int]
    KPI_NAME_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    interaction_id: str
    kind: str
    value: float
    comment: str
    kpi_name: str
    occurred_at: _timestamp_pb2.Timestamp
    tenant: str
    def __init__(self, interaction_id: _Optional[str] = ..., kind: _Optional[str] = ..., value: _Optional[float] = ..., comment: _Optional[str] = ..., kpi_name: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

class FeedbackAck(_message.Message):
    __slots__ = ("event_id", "accepted")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    accepted: bool
    def __init__(self, event_id: _Optional[str] = ..., accepted: _Optional[bool] = ...) -> None: ...
