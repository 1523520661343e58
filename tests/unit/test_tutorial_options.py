"""The tutorial's account of ``examples/flight/grpo.yaml`` is the file's: a reader who changes an option from
what the page says finds it there with the value the page gives (the page once said 2e-4 where the file had 4e-4)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]


def test_the_options_the_tutorial_names_are_the_configs() -> None:
    config = yaml.safe_load((ROOT / "examples" / "flight" / "grpo.yaml").read_text())
    text = " ".join((ROOT / "docs" / "tutorial.md").read_text().split())
    said = re.search(
        r"grpo\.yaml` sets the algorithm's options: (\d+) tasks per step, each rolled out (\d+) times .*?"
        r"a learning rate of ([\d.e-]+), a KL penalty of ([\d.]+) .*? every (\d+) steps",
        text,
    )
    assert said, "the tutorial no longer describes grpo.yaml's options in the sentence this test reads"
    tasks, group, rate, kl, every = said.groups()
    assert (int(tasks), int(group)) == (config["tasks_per_step"], config["group_size"])
    assert float(rate) == config["learning_rate"] and float(kl) == config["kl_beta"]
    assert int(every) == config["eval_every"]
