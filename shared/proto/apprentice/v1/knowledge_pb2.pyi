from shared.proto.apprentice.v1 import events_pb2 as _events_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListKnowledgeRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class KnowledgeSummary(_message.Message):
    __slots__ = ("key", "version", "item_count", "approved_count", "proposed_count", "pinned_count", "rejected_count", "require_approval", "training_count")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ITEM_COUNT_FIELD_NUMBER: _ClassVar[int]
    APPROVED_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_COUNT_FIELD_NUMBER: _ClassVar[int]
    PINNED_COUNT_FIELD_NUMBER: _ClassVar[int]
    REJECTED_COUNT_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    TRAINING_COUNT_FIELD_NUMBER: _ClassVar[int]
    key: str
    version: int
    item_count: int
    approved_count: int
    proposed_count: int
    pinned_count: int
    rejected_count: int
    require_approval: bool
    training_count: int
    def __init__(self, key: _Optional[str] = ..., version: _Optional[int] = ..., item_count: _Optional[int] = ..., approved_count: _Optional[int] = ..., proposed_count: _Optional[int] = ..., pinned_count: _Optional[int] = ..., rejected_count: _Optional[int] = ..., require_approval: _Optional[bool] = ..., training_count: _Optional[int] = ...) -> None: ...

class ListKnowledgeResponse(_message.Message):
    __slots__ = ("bases",)
    BASES_FIELD_NUMBER: _ClassVar[int]
    bases: _containers.RepeatedCompositeFieldContainer[KnowledgeSummary]
    def __init__(self, bases: _Optional[_Iterable[_Union[KnowledgeSummary, _Mapping]]] = ...) -> None: ...

class GetKnowledgeRequest(_message.Message):
    __slots__ = ("key", "version", "training_view")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINING_VIEW_FIELD_NUMBER: _ClassVar[int]
    key: str
    version: int
    training_view: bool
    def __init__(self, key: _Optional[str] = ..., version: _Optional[int] = ..., training_view: _Optional[bool] = ...) -> None: ...

class ItemActionRequest(_message.Message):
    __slots__ = ("key", "item_id", "operator", "override_screen")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_SCREEN_FIELD_NUMBER: _ClassVar[int]
    key: str
    item_id: str
    operator: str
    override_screen: bool
    def __init__(self, key: _Optional[str] = ..., item_id: _Optional[str] = ..., operator: _Optional[str] = ..., override_screen: _Optional[bool] = ...) -> None: ...

class EditItemRequest(_message.Message):
    __slots__ = ("key", "item_id", "text", "operator")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    key: str
    item_id: str
    text: str
    operator: str
    def __init__(self, key: _Optional[str] = ..., item_id: _Optional[str] = ..., text: _Optional[str] = ..., operator: _Optional[str] = ...) -> None: ...
