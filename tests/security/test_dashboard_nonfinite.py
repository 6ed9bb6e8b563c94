"""Attack (SECURITY.md §4): a version whose gate score is NaN made the dashboard's JSON answers (`/api/versions`)
raise in the encoder (Starlette refuses NaN), a 500 that broke the page for every operator. Every JSON answer
of the dashboard goes through `_json`, which now writes non-finite numbers as null."""

from __future__ import annotations

import json
import math

from services.dashboard.web import _json


def test_non_finite_scores_serialise_as_null() -> None:
    body = {"versions": [{"version": "v3", "eval_results": [{"candidate": math.nan, "baseline": math.inf,
                                                             "threshold": -math.inf, "delta": 0.5}]}]}
    response = _json(body)
    assert response.status_code == 200
    decoded = json.loads(bytes(response.body))
    assert decoded["versions"][0]["eval_results"][0] == {"candidate": None, "baseline": None, "threshold": None,
                                                          "delta": 0.5}
