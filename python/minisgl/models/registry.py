from minisgl.registry import Registry

MODELS: Registry = Registry("model architecture")
MODELS.register("qwen3_5_moe", "minisgl.models.qwen3_5_moe:Qwen3_5MoeForCausalLM")
# Qwen3-MoE is the same decoder with every layer full attention, plain RMSNorm, no output gate and
# no shared expert; the parsed config carries those differences, so one definition serves both.
MODELS.register("qwen3_moe", "minisgl.models.qwen3_5_moe:Qwen3_5MoeForCausalLM")
