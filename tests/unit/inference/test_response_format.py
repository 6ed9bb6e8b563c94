"""`response_format` validation for both doors (services/inference/requests.py `response_grammar`): each bad
format is a ResponseFormatError (an InvalidRequest: gRPC INVALID_ARGUMENT, HTTP 400 param response_format)."""

from __future__ import annotations

import json

import pytest

from services.inference.requests import ResponseFormatError, response_grammar
from shared.proto.apprentice.v1 import common_pb2
from shared.rpc.grpc_util import InvalidRequest


def test_formats_map_to_grammars() -> None:
    assert response_grammar(common_pb2.ResponseFormat()) is None
    assert response_grammar(common_pb2.ResponseFormat(type="text")) is None
    g = response_grammar(common_pb2.ResponseFormat(type="json_object"))
    assert g is not None and g.kind == "json_object"
    schema = json.dumps({"type": "object", "properties": {"a": {"enum": [1, 2]}}})
    g = response_grammar(common_pb2.ResponseFormat(type="json_schema", schema_json=schema, strict=True))
    assert g is not None and (g.kind, g.source) == ("json_schema", schema)


@pytest.mark.parametrize("rf, fragment", [
    (common_pb2.ResponseFormat(type="xml"), "type must be"),
    (common_pb2.ResponseFormat(type="json_schema"), "is required"),
    (common_pb2.ResponseFormat(type="json_schema", schema_json="{oops"), "not valid JSON"),
    (common_pb2.ResponseFormat(type="json_schema", schema_json='{"type": "array"}'), "object schema"),
    (common_pb2.ResponseFormat(type="json_schema", schema_json='{"type": "object", "properties": {"a": '
                                                                 '{"type": "nope"}}}'), "cannot be enforced"),
    (common_pb2.ResponseFormat(type="json_schema", schema_json=json.dumps({"d": "x" * 70000})), "larger than"),
])
def test_bad_formats_are_invalid_argument(rf: common_pb2.ResponseFormat, fragment: str) -> None:
    with pytest.raises(ResponseFormatError, match=fragment) as e:
        response_grammar(rf)
    assert isinstance(e.value, InvalidRequest) and e.value.param == "response_format"
