"""The detokenizer process: turns the engine's token outputs into text deltas (UTF-8-safe, stop
strings held back and cut) and forwards everything else from the engine unchanged, in order."""
from __future__ import annotations

import logging
from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from minisgl.scheduler.messages import RequestOutput
from minisgl.server.channel import Addresses, Receiver, Sender
from minisgl.server.child import parent_alive, setup_child
from minisgl.server.messages import TextBatch, TokenBatch
from minisgl.tokenizer.detokenizer import TextStream
from minisgl.tokenizer.tokenizer import load_tokenizer

POLL_MS = 200
logger = logging.getLogger(__name__)


class Detokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.streams: dict[str, TextStream] = {}

    def convert(self, batch: TokenBatch) -> TextBatch:
        for rid, spec in batch.specs:
            self.streams[rid] = TextStream(self.tokenizer, spec.skip_special_tokens, spec.stop, spec.min_tokens)
        return TextBatch(tuple(self._one(o) for o in batch.outputs))

    def _one(self, o: RequestOutput) -> RequestOutput:
        # A rejected request (o.error) never had a stream.
        stream = self.streams.pop(o.rid, None) if o.finished else self.streams.get(o.rid)
        return replace(o, text=stream.push(o.new_token_ids, o.finished)) if stream is not None else o


def detokenizer_main(model_path: str, addrs: Addresses, parent_pid: int) -> None:
    setup_child("detok")  # ps keeps 15 characters: minisgl-detok
    tokenizer = load_tokenizer(model_path)
    logger.info("ready: %s, %d tokens", type(tokenizer).__name__, len(tokenizer))
    detok = Detokenizer(tokenizer)
    inbox, out = Receiver(addrs.detokenizer), Sender(addrs.api)
    while parent_alive(parent_pid):
        for msg in inbox.recv_all(POLL_MS):
            out.send(detok.convert(msg) if isinstance(msg, TokenBatch) else msg)
