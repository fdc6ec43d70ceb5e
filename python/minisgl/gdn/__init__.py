"""Gated DeltaNet (linear attention) backends: causal depthwise conv + gated delta rule over pooled state."""
