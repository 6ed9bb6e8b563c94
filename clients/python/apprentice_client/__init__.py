"""Apprentice's light Python client: the product-facing gRPC surface with grpcio and protobuf only.

`InferenceClient` calls Generate, GenerateStream and Feedback (TLS, bearer key, tenant). The generated
messages and stubs are here too, for code that prefers raw stubs:

    from apprentice_client import common_pb2, inference_pb2, inference_pb2_grpc

`interaction_id_of` / `feedback` (answers.py) send feedback on answers got through the OpenAI SDK or LangChain.
"""

from apprentice_client._proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from apprentice_client.answers import NoInteractionId, feedback, interaction_id_of, session_id_of
from apprentice_client.client import (
    TENANT_METADATA,
    InferenceClient,
    MessagesLike,
    channel_credentials,
    to_messages,
)

__version__ = "0.1.0"

__all__ = ["TENANT_METADATA", "InferenceClient", "MessagesLike", "NoInteractionId", "channel_credentials",
           "common_pb2", "feedback", "inference_pb2", "inference_pb2_grpc", "interaction_id_of", "session_id_of",
           "to_messages"]
