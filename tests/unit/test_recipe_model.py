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


# Finding 8: `model.aliases`, opt-in names the gateway accepts for the served model.


def test_model_aliases_are_names_distinct_and_not_the_served_name() -> None:
    from appliance.recipe.recipe_model import ModelSpec

    ok = ModelSpec(path="/m", served_name="smollm2", aliases=("smol", "small"))
    assert ok.aliases == ("smol", "small")
    for bad, why in (((" ",), "non-empty"), (("",), "non-empty"), (("smol", "smol"), "listed twice: smol"),
                     (("smollm2",), "is the served name")):
        with pytest.raises(ValidationError, match=why):
            ModelSpec(path="/m", served_name="smollm2", aliases=bad)
    with pytest.raises(ValidationError, match="Extra inputs"):
        ModelSpec.model_validate({"path": "/m", "served_name": "s", "alias": ["x"]})


def test_no_aliases_leaves_the_dump_as_it_was() -> None:
    from appliance.recipe.recipe_model import ModelSpec

    assert ModelSpec(path="/m", served_name="s").model_dump() == {"path": "/m", "served_name": "s",
                                                                  "host_path": None}
    assert ModelSpec(path="/m", served_name="s", aliases=("a",)).model_dump()["aliases"] == ("a",)
