"""How far a prompt's last logits move when the same prompt is prefilled alone (64 tokens) or in a
batch of 16 (1,024 tokens, where the FP8 projections and the MoE take other kernels, so other
rounding), on the Qwen3.5-122B-A10B FP8 config with dummy weights, by depth:

    python benchmarks/dummy_divergence.py 4,16,48      # layer counts; writes $OUT/dummy_divergence.json

Random weights amplify a rounding difference from layer to layer (a flipped expert choice moves a
token's MoE output by O(1)), so on the full-depth dummy model two batchings of the same prompt give
unrelated top-1 tokens: comparisons on dummy weights must keep the batching fixed
(benchmarks/afd_agreement.py does), and agreement bars across batchings need a trained model.
"""
import gc
import json
import os
import sys
import tempfile
import time

import torch
from minisgl.engine.args import EngineArgs
from minisgl.engine.engine import Engine
from minisgl.engine.plan import resolve_plan
from minisgl.models.known_configs import config_dir

def logits(engine, seqs):
    slots = [engine.pool.allocate(len(s)) for s in seqs]
    for sl, s in zip(slots, seqs):
        engine.pool.ensure_tokens(sl, len(s))
    rows = torch.tensor([sum(len(x) for x in seqs[:i + 1]) - 1 for i in range(len(seqs))], device=engine.device)
    out = engine.forward_batch(engine.make_batch(seqs, [0] * len(seqs), slots), rows).float().cpu()
    for sl in slots:
        engine.pool.free(sl)
    return out

res = []
for L in [int(x) for x in sys.argv[1].split(",")]:  # a fresh engine per depth, one at a time on the GPU
    t0 = time.time()
    path = config_dir("Qwen3.5-122B-A10B", fp8=True, root=tempfile.mkdtemp())
    f = os.path.join(path, "config.json")
    raw = json.load(open(f))
    raw["text_config"]["num_hidden_layers"] = L
    raw["text_config"].pop("layer_types", None)
    json.dump(raw, open(f, "w"))
    eng = Engine(resolve_plan(EngineArgs(path, load_format="dummy", context_length=256, page_size=64,
                 max_running_requests=16, num_pages=16 * 4 + 1, disable_cuda_graph=True)), warm_up=False)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 240000, (64,), generator=g).tolist() for _ in range(16)]
    with torch.inference_mode():
        batch = logits(eng, prompts)
        alone = torch.cat([logits(eng, [p]) for p in prompts])
        again = torch.cat([logits(eng, [p]) for p in prompts])
    rel = ((batch - alone).norm(dim=-1) / alone.norm(dim=-1))
    top = alone.topk(2, dim=-1).values
    r = dict(layers=L, rel_err_median=round(rel.median().item(), 4), rel_err_max=round(rel.max().item(), 4),
             top1_same=int((batch.argmax(-1) == alone.argmax(-1)).sum()), of=16,
             repeat_identical=bool(torch.equal(alone, again)),
             gap_median=round((top[:, 0] - top[:, 1]).median().item(), 4), logit_std=round(alone.std().item(), 3),
             seconds=round(time.time() - t0, 1))
    print(json.dumps(r), flush=True)
    res.append(r)
    del eng
    gc.collect()
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "dummy_divergence.json"), "w"))
