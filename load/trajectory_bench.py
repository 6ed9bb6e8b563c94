"""Cost of assembling an agent trajectory at capture time (services/inference/trajectory.py), on the
request's path: `assemble` for a session that continues its own last turn, `best` among 64 candidate
sessions that share a system prompt (a request that names no session), and an edit early in the history
(realignment). Synthetic turns of random 50k-vocabulary tokens, a 200-token tool result appended.

    .venv/bin/python -m load.trajectory_bench
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from services.inference.trajectory import Turn, assemble, best, turn_of
from shared.proto.apprentice.v1 import events_pb2


def _turn(prompt: list[int], resp: list[int]) -> Turn:
    ev = events_pb2.Interaction(interaction_id="x", prompt_token_ids=prompt, response_token_ids=resp,
                                response_logprobs=[-0.5] * len(resp), response_logprobs_t1=[-0.5] * len(resp))
    t = turn_of(ev)
    assert t is not None
    return t


def _ms(fn: Callable[..., object], *args: object, k: int = 20) -> float:
    t0 = time.perf_counter()
    for _ in range(k):
        fn(*args)
    return (time.perf_counter() - t0) / k * 1000


def main() -> None:
    """Print one line per history length (ms per call)."""
    rng = random.Random(0)
    for n in (2000, 8000, 32000):
        prompt = [rng.randrange(50000) for _ in range(500)]
        resp = [rng.randrange(50000) for _ in range(n - 500)]
        own = _turn(prompt, resp)
        nxt = prompt + resp + [rng.randrange(50000) for _ in range(200)]
        others = [_turn(prompt[:400] + [rng.randrange(50000) for _ in range(100)], resp) for _ in range(63)]
        edited = list(nxt)
        edited[600] = 7
        found = best([*others, own], nxt)
        assert found is not None and found[1] is own
        print(f"{n:>6} tokens of history: continue {_ms(assemble, own, nxt):.2f} ms, "
              f"among 64 sessions {_ms(best, [*others, own], nxt):.2f} ms, "
              f"edited at token 600 {_ms(assemble, own, edited):.2f} ms")


if __name__ == "__main__":
    main()
