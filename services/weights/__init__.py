"""Weights service: versioned checkpoint store, eval gate, promotion / canary / rollback, weight streaming.

Checkpoint bytes --> content-addressed blobs + a `Manifest` per version --> `ModelUpdate` orders for
inference pods, which report back by heartbeat (docs/architecture.md §2).
"""
