from minisgl.registry import Registry

MOE_BACKENDS: Registry = Registry("moe")
MOE_BACKENDS.register("torch", "minisgl.moe.torch_experts:TorchExperts")
MOE_BACKENDS.register("triton", "minisgl.moe.triton_experts:TritonExperts")
MOE_BACKENDS.register("deep_gemm", "minisgl.moe.deep_gemm_experts:DeepGemmExperts")
