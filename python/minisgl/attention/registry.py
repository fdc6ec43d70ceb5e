from minisgl.registry import Registry

ATTENTION_BACKENDS: Registry = Registry("attention")
ATTENTION_BACKENDS.register("torch", "minisgl.attention.torch_backend:TorchAttentionBackend")
ATTENTION_BACKENDS.register("triton", "minisgl.attention.triton_backend:TritonAttentionBackend")
