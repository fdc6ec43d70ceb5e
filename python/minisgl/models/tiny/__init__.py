"""The tiny Qwen3.5-MoE the project ships as its default model (default.py, trained by
`python -m minisgl.models.tiny.train`), and random tiny checkpoints in the official on-disk layout
for tests (make.py). docs/tiny_model.md tells the story."""
