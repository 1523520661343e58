"""``store train --set NAME=VALUE``: options laid over ``--config``'s, values read as YAML, dotted names nested."""

from __future__ import annotations

import pytest
import typer

from algorithms.cli import override

CONFIG = {"tasks_per_step": 4, "group_size": 4, "lora": {"r": 8, "lora_alpha": 16}}


def test_set_overrides_adds_and_nests_without_touching_the_config() -> None:
    merged = override(CONFIG, ["tasks_per_step=2", "learning_rate=2.0e-4", "lora.r=4", "agents=write|rewrite"])
    assert merged == {
        "tasks_per_step": 2,
        "group_size": 4,
        "learning_rate": 2.0e-4,
        "lora": {"r": 4, "lora_alpha": 16},
        "agents": "write|rewrite",
    }
    assert CONFIG["lora"] == {"r": 8, "lora_alpha": 16}  # the config read is not changed in place
    assert override({}, ["lora.target_modules=[q_proj, v_proj]", "asynchronous=true", "judge=null"]) == {
        "lora": {"target_modules": ["q_proj", "v_proj"]},
        "asynchronous": True,
        "judge": None,
    }
    assert override(CONFIG, ["group_size=2", "group_size=8"])["group_size"] == 8  # the last one wins


@pytest.mark.parametrize(
    ("assignment", "said"),
    [
        ("group_size", "give NAME=VALUE"),
        ("=2", "give NAME=VALUE"),
        ("lora..r=2", "give NAME=VALUE"),
        ("group_size.x=2", "group_size is not a mapping"),
        ("lora=[q_proj", "not YAML"),
    ],
)
def test_a_malformed_set_is_a_usage_error_naming_it(assignment: str, said: str) -> None:
    with pytest.raises(typer.BadParameter) as error:
        override(CONFIG, [assignment])
    assert said in str(error.value) and error.value.param_hint == "--set"
