"""Grader service: Interaction + FeedbackEvents --> GradedInteraction (reward, components, hacking flags).

Two runtimes (`runtime.py`): native (`native_runtime.py`, confluent-kafka with one transaction per
batch; the default) and faust (`app.py`). Both run the same pure modules: `routing.py` (source record
-> join item), `join.py` (timing, revisions, idempotency), `components.py` (graders -> reward),
`detectors.py` (reward hacking), `judge_groups.py` + `judge.py` (LLM judge), `state.py` (table values).
Rule graders and the config schema are shared: `shared/grading`.
"""
