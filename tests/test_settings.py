"""The run group's settings: a non-finite number in any float setting is refused by name, in one line, whether it
comes from a config or the command line (moved from test_errors.py)."""

import dataclasses
import math
import re

import pytest
from conftest import one_line

from specbench.config import compose
from specbench.errors import SpecbenchError
from specbench.settings import RunSettings


FLOAT_SETTINGS = [field.name for field in dataclasses.fields(RunSettings) if "float" in str(field.type)]


def test_the_float_settings_are_found():
    assert {"temperature", "top_p", "draft_budget_prior", "verify_cost_smoothing"} <= set(FLOAT_SETTINGS)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOAT_SETTINGS)
def test_non_finite_numbers_are_refused_by_name(key, value):
    with pytest.raises(SpecbenchError, match=rf"^run\.{key} must be a finite number, got") as error:
        RunSettings.from_config({key: value})
    one_line(error)


@pytest.mark.parametrize("override", ["run.temperature=nan", "run.temperature=inf", "run.draft_budget_memory=inf"])
def test_non_finite_numbers_from_the_command_line_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(SpecbenchError, match=rf"^{re.escape(key)} must be a finite number"):
        RunSettings.from_config(compose([override]).run)
