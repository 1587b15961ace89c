"""Recipe model edge cases that the loader tests do not reach."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from appliance.recipe.recipe_model import EngineArgs, Environment, GraphMode


def test_env_shorthand_accepts_strings_and_numbers() -> None:
    env = Environment.model_validate({"vars": {"A": "x", "B": 1}})
    assert env.vars["A"].value == "x"
    assert env.vars["B"].value == "1"


def test_env_unquoted_yaml_bool_is_an_error_not_the_string_False() -> None:
    with pytest.raises(ValidationError, match="quoted string"):
        Environment.model_validate({"vars": {"VLLM_USE_AOT_COMPILE": False}})


def test_eager_mode_rejects_graph_options() -> None:
    with pytest.raises(ValidationError, match="enforce-eager"):
        EngineArgs(mode=GraphMode.EAGER, cudagraph_mode="PIECEWISE")


def test_unknown_engine_key_rejected() -> None:
    with pytest.raises(ValidationError, match="extra"):
        EngineArgs.model_validate({"tensor_paralel_size": 4})
