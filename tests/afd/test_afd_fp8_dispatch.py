"""AFD with FP8 dispatch (the experts' input crosses to the expert workers as e4m3 with a scale per
128 values) against the colocated engine, on the trained model in fp32 on the CPU (gloo), gated as
tests/agreement.py says. AFD returns no logprobs, so the teacher-forced top-1 asks AFD for one
greedy token after every scored prefix of the colocated run's greedy continuations (512 requests).
BF16 dispatch is exact (test_afd_identity.py); FP8 dispatch rounds, so it gets the bars instead."""
from __future__ import annotations

from agreement import GAP_BOUND, GREEDY_STEPS, MIN_TOP1, SEAM, STEPS, greedy, greedy_check, heldout_prompts, reference
from minisgl import LLM
from minisgl.afd.args import AfdArgs

ENGINE = dict(dtype="float32", device="cpu", page_size=16, context_length=512, max_running_requests=32)


def test_fp8_dispatch_follows_colocated(tiny_checkpoints: dict[str, str]) -> None:
    path = tiny_checkpoints["trained"]
    prompts = heldout_prompts(path)
    ref = reference(LLM(path, **ENGINE), prompts)
    afd = AfdArgs(attn_workers=1, expert_workers=2, num_mb=2, dispatch_dtype="fp8")
    with LLM(path, afd=afd, **ENGINE) as llm:
        prefixes = [p + t[:k] for p, t in zip(prompts, ref.tokens) for k in range(SEAM, SEAM + STEPS)]
        picks = [r.token_ids[0] for r in llm.generate(prefixes, greedy(1))]
        got = [list(r.token_ids) for r in llm.generate(prompts, greedy(GREEDY_STEPS))]
    want = [t for tokens in ref.tokens for t in tokens[SEAM:]]
    agreement = sum(p == w for p, w in zip(picks, want)) / len(want)
    check = greedy_check(ref, got, GAP_BOUND["fp8_dispatch"])
    print(f"AFD {afd.attn_workers}+{afd.expert_workers} FP8 dispatch: teacher-forced top-1 {agreement:.4f} over "
          f"{len(want)} positions; greedy: {check.compared} steps compared, {check.parted} prompts parted at gaps "
          f"<= {GAP_BOUND['fp8_dispatch']}")
    assert len(want) == 512 and agreement >= MIN_TOP1
    assert not check.failures, check.failures
