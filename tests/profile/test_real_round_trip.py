"""A real captured profile survives save and load exactly (times included)."""

from __future__ import annotations

import json

import torch

import graphprof
from graphprof.demo.steps import mlp_sgd_step


def test_real_profile_round_trips_unchanged(tmp_path) -> None:
    demo = mlp_sgd_step()
    fn = graphprof.trace(demo.step_fn)
    for i in range(5):
        fn(*demo.make_inputs(i))
    profile = fn.get_profile()
    saved, dumped = tmp_path / "saved.json", tmp_path / "dumped.json"
    profile.save(str(saved))
    with open(dumped, "w") as f:
        json.dump(profile, f)
    assert graphprof.load(saved) == profile
    assert graphprof.load(dumped) == profile
    assert torch.is_tensor(demo.model[0].weight)  # the model is untouched by saving
