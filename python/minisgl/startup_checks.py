"""Start-up mistakes, found before anything loads or starts, each reported as one line that says
what is wrong and how to fix it: a model path that is a Hugging Face id or does not exist, a
folder that is not a checkpoint, a CUDA device without CUDA torch or Triton, a busy port."""
from __future__ import annotations

import importlib.util
import os
import re
import socket

import torch

from minisgl.tokenizer.tokenizer import check_has_tokenizer

_HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class StartupError(ValueError):
    """A mistake in the flags or the environment; str() is the one-line message with its hint."""


class ModelPathError(StartupError, FileNotFoundError):
    """The model path is not a usable checkpoint (also what callers catching a missing file expect)."""


def check_startup(device: str, model_path: str | None, load_format: str) -> None:
    """What the command line checks before it starts anything: the device and the whole checkpoint."""
    check_device(device)
    if model_path is not None:
        check_model_path(model_path, load_format)


def check_model_path(path: str, load_format: str = "auto", contents: bool = True) -> None:
    """A local checkpoint directory with config.json; with `contents`, also a tokenizer and (unless
    dummy) safetensors. (The offline API checks contents later, after the layout checks that a
    config alone allows.)"""
    if not os.path.exists(path):
        if _HF_ID.fullmatch(path) and not path.startswith("."):
            raise ModelPathError(f"model path {path!r} does not exist here; it looks like a Hugging Face id, and "
                               f"minisgl reads local checkpoints only (hint: download it first, e.g. "
                               f"`huggingface-cli download {path} --local-dir DIR`, then pass DIR)")
        raise ModelPathError(f"model path {path!r} does not exist (hint: pass the checkpoint folder that holds "
                           f"config.json, or leave it out for the embedded tiny model)")
    if not os.path.isdir(path):
        raise ModelPathError(f"model path {path!r} is a file (hint: pass the folder that holds it)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelPathError(f"{path!r} has no config.json, so it is not a model checkpoint (hint: pass the folder "
                           f"that holds config.json, *.safetensors and the tokenizer)")
    if not contents:
        return
    try:
        check_has_tokenizer(path)
    except ValueError as e:
        raise ModelPathError(str(e)) from None
    if load_format != "dummy" and not any(name.endswith(".safetensors") for name in os.listdir(path)):
        raise ModelPathError(f"{path!r} has no *.safetensors weights (hint: --load-format dummy runs the config's "
                           f"shapes with random weights)")


def check_device(device: str) -> None:
    """A CUDA device (explicit, or auto on a machine with a GPU) needs CUDA torch, a GPU of that index, and Triton for the kernels."""
    if device == "auto":  # cuda when there is one
        if not torch.cuda.is_available():
            return
        device = "cuda"
    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise StartupError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA GPU (hint: install "
                           f"a CUDA build of torch — `make install` does on a machine with nvidia-smi — or use "
                           f"--device cpu)")
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        raise StartupError(f"--device {device}: this machine has {torch.cuda.device_count()} GPUs (hint: "
                           f"cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    if importlib.util.find_spec("triton") is None:
        raise StartupError(f"--device {device} runs Triton kernels, and triton is not installed (hint: "
                           f"pip install -e '.[gpu]', or `make install` on a machine with nvidia-smi)")


def bind_port(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now so a busy port is found before minutes of loading
    (and nobody takes it meanwhile); the HTTP server serves on it once the engine is ready."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {e.strerror} (hint: another server holds the port? "
                           f"stop it or pick another with --port)") from None
    return sock
