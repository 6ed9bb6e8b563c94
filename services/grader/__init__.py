"""Grader service: Interaction + FeedbackEvents --> GradedInteraction (reward, components, hacking flags).

Two runtimes (`runtime.py`, `APPRENTICE_GRADER_RUNTIME`): faust (`app.py`, faust-streaming agents; the
default) and native (`native_runtime.py`, confluent-kafka with one transaction per batch; supported and
tested the same way). Both run the same pure modules: `routing.py` (source record -> join item),
`join.py` (timing, revisions, idempotency), `components.py` (graders -> reward), `detectors.py` (reward
hacking), `judge_groups.py` + `judge.py` (LLM judge), `state.py` (table values). Rule graders and the
config schema are shared: `shared/grading`. README.md says which runtime is the default and why.
"""
