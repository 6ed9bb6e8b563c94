"""Prometheus metrics of the weights service (served on :9105/metrics).

The eval gate is timed and counted where it runs (evaluator.py), so both of its callers, the
checkpoints consumer (the automatic path) and an operator's Promote/Canary of a version never
evaluated, feed the same histogram, and a version evaluated once is counted once.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

UPLOADS = Counter("apprentice_weights_uploads_total", "Upload calls by outcome", ["outcome"])
UPLOAD_BYTES = Counter("apprentice_weights_upload_bytes_total", "Bytes received by Upload")
DOWNLOAD_BYTES = Counter("apprentice_weights_download_bytes_total", "Bytes sent by Download")
ORDERS = Counter("apprentice_weights_orders_total", "ModelUpdate orders sent", ["action"])
EVALS = Counter("apprentice_weights_evaluations_total", "Eval gate verdicts", ["verdict"])
EVALS_RUNNING = Gauge("apprentice_weights_evaluations_running",
                      "Eval gate runs in progress on this replica (one at a time): a promotion waiting on its gate")
EVAL_SECONDS = Histogram("apprentice_weights_eval_seconds", "Eval gate duration (materialise, integrity, scoring)",
                         buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200))
PODS = Gauge("apprentice_weights_pods", "Pods reporting by heartbeat, by state (converged, lagging, total)",
             ["model", "state"])
