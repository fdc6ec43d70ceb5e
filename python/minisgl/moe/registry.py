from minisgl.registry import Registry

MOE_BACKENDS: Registry = Registry("moe")
MOE_BACKENDS.register("torch", "minisgl.moe.torch_experts:TorchExperts")
