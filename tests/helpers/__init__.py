"""What the tests (and the benchmarks under load/) share: real servers, real topics, no mocks.

| module | what |
|---|---|
| `waiting.py` | `wait_for`: poll a condition while something makes progress (the one wait of the suite) |
| `ports.py` | free loopback ports |
| `kafka.py` | reading topics (`TopicReader`, `read_all`, `collect`, `read_to_end`) and a private broker |
| `grader.py` | grader events, the grader as a real subprocess, its environment |
| `inference.py` | the real inference service on port 0 with the tiny model |
| `weights.py` | the real Weights service on loopback, versions uploaded with the real client |
| `greedy.py` | two greedy runs compared token by token (same weights or not) |
| `chaos.py`, `chaos_faults.py`, `chaos_invariants.py` | the chaos run: faults under load, then invariants |

Nothing under `services/` or `shared/` imports this package. Importing it loads nothing heavy: each module
imports what it needs.
"""
