"""Deprecated location of the inference client: it moved to the light `apprentice-client` distribution
(`clients/python`, grpcio + protobuf only), so that product backends do not install torch with it.

    from apprentice_client import InferenceClient      # instead of services.inference.client

This module re-exports it for existing code (load scripts, tests) and will be removed in a later
release. Behaviour change of the move: a client without `timeout` sends calls without a deadline (the
old default was 120 s); pass `timeout=` to keep one.
"""

from __future__ import annotations

from apprentice_client import InferenceClient, MessagesLike, to_messages

__all__ = ["InferenceClient", "MessagesLike", "to_messages"]
