"""The metric names readers rely on (shared/contracts/metric_names.py) are series the services really
expose: each one is a sample name of a collector some services/<name>/metrics.py defines, of the kind the
contract says (a counter's sample ends in _total), so a renamed metric fails here, not in a blank report."""

from __future__ import annotations

import pytest

from shared.contracts import metric_names as N
from tests.unit.test_metrics_catalog import registered

CONTRACT = {name: value for name, value in vars(N).items() if name.isupper() and isinstance(value, str)}


def test_the_contract_names_the_series_status_and_the_dashboard_read() -> None:
    assert {"INFERENCE_SPOOL_DEPTH", "GRADER_WAITING", "GRADER_UNREAD_FEEDBACK_NOW"} <= set(CONTRACT)


@pytest.mark.parametrize("const", sorted(CONTRACT))
def test_every_contract_name_is_a_series_a_service_exposes(const: str) -> None:
    sample = CONTRACT[const]
    families = registered()
    family = sample.removesuffix("_total") if sample.endswith("_total") else sample
    assert family in families, f"{const} = {sample!r}: no service defines it"
    kind, module, _ = families[family]
    assert module.startswith("services.") and module.endswith(".metrics"), module
    assert (kind == "counter") == sample.endswith("_total"), f"{sample}: a {kind}"


def test_counter_name_refuses_a_sample_that_is_not_a_counters() -> None:
    assert N.counter_name("apprentice_x_total") == "apprentice_x"
    with pytest.raises(ValueError):
        N.counter_name("apprentice_x")
