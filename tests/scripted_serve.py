"""`python tests/scripted_serve.py serve ...`: `minisgl serve` whose engine follows a script for
some requests, so that chat tests can decode known text (a thinking block, a tool call) through
the tiny model and the real server. $MINISGL_TEST_SCRIPTS maps a request seed to token ids; a
request with that seed runs the model at every step as usual, but its n-th token is the script's
n-th, as long as the script lasts. Requests with other seeds sample normally.

The engine runs in a spawned process, which re-runs this file as its main module: the patch below
is applied there too.
"""
from __future__ import annotations

import json
import os

import torch

from minisgl.engine import sampler
from minisgl.scheduler import scheduler

SCRIPTS = {int(seed): ids for seed, ids in json.loads(os.environ.get("MINISGL_TEST_SCRIPTS", "{}")).items()}


class ScriptedSampler(sampler.Sampler):
    def sample(self, logits: torch.Tensor, keys: list[int]) -> torch.Tensor:
        live = [self._live[k] for k in keys]  # the count before this sample: the script position
        steps = [(SCRIPTS.get(r.params.seed), r.num_sampled) for r in live]
        out = super().sample(logits, keys)
        for i, (script, n) in enumerate(steps):
            if script is not None and n < len(script):
                out[i] = script[n]
        return out


scheduler.Sampler = ScriptedSampler

if __name__ == "__main__":
    from minisgl.__main__ import main

    main()
