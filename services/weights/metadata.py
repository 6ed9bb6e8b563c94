"""Free-form metadata on an upload --> accepted within written bounds, or INVALID_ARGUMENT naming the bound;
stored manifests --> answers that fit any client's message limit.

Why: a manifest is returned whole by `Weights.List` (every version at once), `Get`, and the first chunk of
every `Download`. A 30 MB `training_metadata` was once stored, and from then on `apprentice weights list`
failed with RESOURCE_EXHAUSTED (gRPC's 4 MiB default receive limit) for every operator, and so did the
trainer's own idempotency check (services/trainer/publish.py lists versions before each upload).

| field | bound |
|---|---|
| all free-form metadata together (training_metadata keys and values, train_metrics keys, data_offsets topics and groups, algorithm, base_model), UTF-8 | 64 KiB |
| training_metadata | at most 256 entries; keys 1-128 characters, no control characters |
| train_metrics | at most 256 entries; keys as above |
| data_offsets | at most 1024 entries |
| algorithm | at most 64 characters |

A manifest stored before these bounds (or written by hand) is not rewritten on disk; `bounded` gives every
answer a copy trimmed to the same 64 KiB, with a `metadata_truncated` entry saying what was left out, so
listing still works and a caller can see why a value is missing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from shared.proto.apprentice.v1 import common_pb2, weights_pb2
from shared.rpc.grpc_util import require

MAX_METADATA_BYTES = 64 << 10
MAX_METADATA_ENTRIES = 256
MAX_METRICS_ENTRIES = 256
MAX_DATA_OFFSETS = 1024
MAX_KEY_CHARS = 128
MAX_ALGORITHM_CHARS = 64
TRUNCATED_KEY = "metadata_truncated"
"""The entry `bounded` adds to a trimmed manifest's training_metadata."""


def _bytes(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _shown(value: str) -> str:
    return repr(value[:40] + ("..." if len(value) > 40 else ""))


def _check_keys(what: str, keys: Iterable[str]) -> None:
    for k in keys:
        require(0 < len(k) <= MAX_KEY_CHARS and k.isprintable(),
                f"{what} key {_shown(k)} must be 1-{MAX_KEY_CHARS} printable characters")


def metadata_bytes(m: weights_pb2.UploadHeader | weights_pb2.Manifest) -> int:
    """The size the 64 KiB bound counts: every free-form string a caller chose."""
    return (sum(_bytes(k) + _bytes(v) for k, v in m.training_metadata.items())
            + sum(_bytes(k) for k in m.train_metrics)
            + sum(_bytes(o.topic) + _bytes(o.group) for o in m.data_offsets)
            + _bytes(m.algorithm) + _bytes(m.base_model))


def validate_metadata(header: weights_pb2.UploadHeader) -> None:
    """INVALID_ARGUMENT, before any byte is stored, when an upload's metadata is over a bound (module table)."""
    require(len(header.training_metadata) <= MAX_METADATA_ENTRIES,
            f"training_metadata has {len(header.training_metadata)} entries, more than the limit of "
            f"{MAX_METADATA_ENTRIES}")
    require(len(header.train_metrics) <= MAX_METRICS_ENTRIES,
            f"train_metrics has {len(header.train_metrics)} entries, more than the limit of {MAX_METRICS_ENTRIES}")
    require(len(header.data_offsets) <= MAX_DATA_OFFSETS,
            f"data_offsets has {len(header.data_offsets)} entries, more than the limit of {MAX_DATA_OFFSETS}")
    require(len(header.algorithm) <= MAX_ALGORITHM_CHARS,
            f"algorithm {_shown(header.algorithm)} is longer than {MAX_ALGORITHM_CHARS} characters")
    _check_keys("training_metadata", header.training_metadata)
    _check_keys("train_metrics", header.train_metrics)
    total = metadata_bytes(header)
    require(total <= MAX_METADATA_BYTES,
            f"upload metadata is {total} bytes (training_metadata, train_metrics keys, data_offsets, algorithm, "
            f"base_model together), more than the limit of {MAX_METADATA_BYTES} bytes (64 KiB); keep large "
            "records in a file of the version and name it in training_metadata")


def _fit(items: Mapping[str, str], budget: int) -> tuple[dict[str, str], list[str]]:
    """The entries that fit `budget`, smallest first (so short identifiers such as checkpoint_id survive a
    huge neighbour), and the keys left out."""
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for k, v in sorted(items.items(), key=lambda kv: (_bytes(kv[0]) + _bytes(kv[1]), kv[0])):
        size = _bytes(k) + _bytes(v)
        if len(kept) < MAX_METADATA_ENTRIES and len(k) <= MAX_KEY_CHARS and size <= budget:
            kept[k] = v
            budget -= size
        else:
            dropped.append(k)
    return kept, dropped


def bounded(m: weights_pb2.Manifest) -> weights_pb2.Manifest:
    """`m` itself when its metadata is within the bounds, else a trimmed copy for an answer (the stored
    manifest is unchanged). Trimmed: training_metadata to what fits the budget left by the other fields,
    train_metrics and data_offsets to their entry limits, algorithm and base_model cut to their lengths."""
    within = (metadata_bytes(m) <= MAX_METADATA_BYTES and len(m.training_metadata) <= MAX_METADATA_ENTRIES
              and len(m.train_metrics) <= MAX_METRICS_ENTRIES and len(m.data_offsets) <= MAX_DATA_OFFSETS
              and len(m.algorithm) <= MAX_ALGORITHM_CHARS)
    if within:
        return m
    out = weights_pb2.Manifest()
    out.CopyFrom(m)
    out.algorithm = m.algorithm[:MAX_ALGORITHM_CHARS]
    out.base_model = m.base_model[:1024]
    metrics = dict(sorted(m.train_metrics.items())[:MAX_METRICS_ENTRIES])
    metrics = {k: v for k, v in metrics.items() if len(k) <= MAX_KEY_CHARS}
    out.train_metrics.clear()
    out.train_metrics.update(metrics)
    del out.data_offsets[:]
    offsets = [o for o in m.data_offsets if _bytes(o.topic) + _bytes(o.group) <= 1024][:MAX_DATA_OFFSETS]
    out.data_offsets.extend(common_pb2.TopicOffsets(topic=o.topic, partition=o.partition, start_offset=o.start_offset,
                                                    end_offset=o.end_offset, group=o.group) for o in offsets)
    out.training_metadata.clear()
    note_reserve = 512
    budget = MAX_METADATA_BYTES - note_reserve - metadata_bytes(out)
    kept, dropped = _fit(dict(m.training_metadata), max(budget, 0))
    out.training_metadata.update(kept)
    shown = ", ".join(sorted(dropped)[:5])[:300]
    out.training_metadata[TRUNCATED_KEY] = (
        f"stored metadata is {metadata_bytes(m)} bytes, over the {MAX_METADATA_BYTES}-byte limit; left out "
        f"{len(dropped)} training_metadata entries ({shown}{', ...' if len(dropped) > 5 else ''})")
    return out
