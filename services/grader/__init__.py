"""Grader service: Interaction + FeedbackEvents --> GradedInteraction (reward, components, hacking flags).

`core/` is the pure grading core: routing.py (source record -> join item), join.py (timing, revisions,
idempotency), components.py (graders -> reward), detectors.py (reward hacking), judge_groups.py +
judge.py (LLM judge), limits.py (what one interaction may hold), state.py (table values). `stream/` is
its faust wiring: app.py builds the faust app and the stages (route, grade, judge, ticker, recovery),
which see it only through context.py's `StageContext`. service.py is the handle `__main__` runs. Rule
graders and the config schema are shared: `shared/grading`. README.md has the whole picture.
"""
