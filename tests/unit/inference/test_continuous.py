"""The transformers engine's continuous scheduler on the tiny model: a short request joins and finishes
while a long one from another tenant runs, with the tokens it gets alone; the rows x tokens cap holds
rows back instead of growing past it; a request cancelled while it waits ends at once; the static
scheduler stays selectable."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from services.inference.engines import create_engine
from services.inference.engines.base import ChoiceDone, Delta, GenerationRequest
from services.inference.settings import InferenceSettings
from shared.decoding.generation import encode_prompt, render_chat
from shared.decoding.params import SamplingConfig
from shared.settings import CommonSettings
from tests.helpers.waiting import wait_for


def _engine(tiny_model_name: str, **settings: Any) -> Any:
    eng = create_engine("transformers", InferenceSettings(common=CommonSettings(model=tiny_model_name), **settings))
    eng.start()
    return eng


@pytest.fixture(scope="module")
def engine(tiny_model_name: str) -> Iterator[Any]:
    eng = _engine(tiny_model_name, batch_wait_ms=0, max_batch_rows=32, tenant_batch_share=0.5)
    yield eng
    eng.shutdown(timeout=5)


def _request(eng: Any, text: str, tenant: str = "t", deadline: float | None = None, stream: bool = False,
             **sampling: Any) -> GenerationRequest:
    ids = encode_prompt(eng.tokenizer, render_chat(eng.tokenizer, [{"role": "user", "content": text}]))
    sampling.setdefault("max_new_tokens", 8)
    return GenerationRequest(request_id=text, prompt_ids=ids, sampling=SamplingConfig(**sampling), tenant=tenant,
                             deadline=deadline, stream=stream)


def test_a_short_request_joins_and_finishes_while_a_long_one_runs(engine: Any) -> None:
    solo = engine.submit(_request(engine, "short one", tenant="B", max_new_tokens=4)).result(timeout=60)[0]
    long = engine.submit(_request(engine, "long one", tenant="A", n=16, max_new_tokens=400, temperature=1.0))
    wait_for(lambda: long.started_at is not None, what="the long batch admitted", every=0.005)
    short = engine.submit(_request(engine, "short one", tenant="B", max_new_tokens=4))
    got = short.result(timeout=60)[0]
    assert not long.done                                      # it finished while the long one ran
    assert short.started_at is not None and long.finished_at is None
    assert got.token_ids == solo.token_ids                    # joining does not change its answer
    assert got.logprobs_t1 == pytest.approx(solo.logprobs_t1, abs=1e-4)
    samples = long.result(timeout=120)
    assert len(samples) == 16 and all(len(s.token_ids) == len(s.logprobs) == len(s.logprobs_t1) for s in samples)
    assert engine._scheduler.admission.rows_in_flight == 0    # every reservation came back


def test_the_token_cap_holds_rows_back_instead_of_growing_past_it(tiny_model_name: str) -> None:
    eng = _engine(tiny_model_name, batch_wait_ms=0, max_batch_tokens=1)    # one row at a time
    try:
        h = eng.submit(_request(eng, "capped", n=3, max_new_tokens=6, stream=True))
        events = list(h.events(timeout=60))
    finally:
        eng.shutdown(timeout=5)
    done_at = {ev.index: k for k, ev in enumerate(events) if isinstance(ev, ChoiceDone)}
    assert sorted(done_at) == [0, 1, 2]
    for k, ev in enumerate(events):                           # row i starts only after row i-1 ended
        if isinstance(ev, Delta) and ev.index > 0:
            assert k > done_at[ev.index - 1]
    assert all(len(ev.sample.token_ids) == len(ev.sample.logprobs) > 0 for ev in events if isinstance(ev, ChoiceDone))


def test_a_request_cancelled_while_waiting_for_room_ends_at_once(engine: Any) -> None:
    other = engine.submit(_request(engine, "other hog", tenant="B", n=16, max_new_tokens=300, temperature=1.0))
    wait_for(lambda: other.started_at is not None, what="the other tenant's request started", every=0.005)
    hog = engine.submit(_request(engine, "hog", tenant="A", n=16, max_new_tokens=300, temperature=1.0))
    wait_for(lambda: hog.started_at is not None, what="the hog's request started", every=0.005)
    # A and B each hold their share (16 rows of 32 at share 0.5), the engine is full: A's next request waits
    waiting = engine.submit(_request(engine, "waits", tenant="A", max_new_tokens=4,
                                     deadline=time.monotonic() + 0.3))
    got = waiting.result(timeout=30)[0]
    assert got.finish_reason == "cancelled" and got.token_ids == []
    assert not hog.done and not other.done
    for h in (hog, other):
        h.cancel()
        assert all(s.finish_reason == "cancelled" for s in h.result(timeout=30))


def test_a_lone_tenant_borrows_the_engine_and_gives_the_excess_back_when_another_arrives(
        tiny_model_name: str) -> None:
    """Alone, tenant A fills the batch beyond its share; B's request makes A give its excess rows back
    (preempted, recomputed later) and starts at once; once B has been idle `tenant_borrow_after_s`, A
    borrows again. Every answer is the one it gives unpreempted."""
    eng = _engine(tiny_model_name, batch_wait_ms=0, max_batch_rows=16, tenant_batch_share=0.25,
                  tenant_borrow_after_s=1.5)
    from prometheus_client import REGISTRY

    preempted = REGISTRY.get_sample_value("apprentice_inference_preempted_rows_total") or 0.0
    try:
        cfg: dict[str, Any] = dict(n=12, max_new_tokens=120, temperature=1.0, seed=9)
        ref = eng.submit(_request(eng, "borrower", tenant="A", **cfg)).result(timeout=120)
        sched = eng._scheduler
        long = eng.submit(_request(eng, "borrower", tenant="A", **cfg))
        wait_for(lambda: sched.admission.usage("A")[0] == 12, what="A's 12 rows at once (3x its share)",
                 every=0.005)
        short = eng.submit(_request(eng, "short one", tenant="B", max_new_tokens=4))
        short.result(timeout=60)
        assert not long.done                                           # B did not wait for A's rows
        assert sched.admission.usage("A")[0] <= 4 or long.done         # A kept its share only ...
        # ... until B had been idle a while
        wait_for(lambda: sched.admission.usage("A")[0] > 4 or long.done, what="A past its share", every=0.005)
        got = long.result(timeout=120)
        assert [s.token_ids for s in got] == [s.token_ids for s in ref]
        for a, b in zip(got, ref, strict=True):
            assert a.logprobs_t1 == pytest.approx(b.logprobs_t1, abs=1e-3)
        assert (REGISTRY.get_sample_value("apprentice_inference_preempted_rows_total") or 0.0) - preempted >= 8
        assert sched.admission.rows_in_flight == 0
    finally:
        eng.shutdown(timeout=5)


def test_static_scheduler_is_still_selectable(tiny_model_name: str) -> None:
    eng = _engine(tiny_model_name, scheduler="static", batch_wait_ms=30)
    try:
        assert eng._scheduler is None
        handles = [eng.submit(_request(eng, f"q{i}")) for i in range(3)]
        results = [h.result(timeout=60) for h in handles]
        assert len({h.started_at for h in handles}) == 1        # one batch, decoded together
        assert all(len(r[0].token_ids) > 0 for r in results)
    finally:
        eng.shutdown(timeout=5)
