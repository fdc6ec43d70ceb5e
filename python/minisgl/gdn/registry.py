"""Name -> GDN backend class; the torch backend is the CPU path and the reference for GPU kernels."""
from __future__ import annotations

from minisgl.registry import Registry

GDN_BACKENDS: Registry = Registry("gdn")
GDN_BACKENDS.register("torch", "minisgl.gdn.torch_backend:TorchGDNBackend")
GDN_BACKENDS.register("triton", "minisgl.gdn.triton_backend:TritonGDNBackend")
GDN_BACKENDS.register("fla", "minisgl.gdn.fla_backend:FlaGDNBackend")
