"""Fixtures for the inference unit tests: the tiny random model, loaded once per session."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny(tiny_model_name: str) -> tuple[Any, Any]:
    from shared.models import load_model

    return load_model(tiny_model_name)
