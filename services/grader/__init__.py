"""Grader service: Interaction + FeedbackEvents --> GradedInteraction (reward, components, hacking flags).

A faust-streaming app (`app.py`) around pure modules: `join.py` (timing, revisions, idempotency),
`components.py` (graders -> reward), `detectors.py` (reward hacking), `judge.py` (LLM judge prompts),
`state.py` (table values). Rule graders and the config schema are shared: `shared/grading`.
"""
