"""A stream of packed training blocks whose position is saved with every checkpoint.

`TokenStream` wraps a `datasets.IterableDataset` of packed blocks (from the sources, or from a
folder `medrecipes build-data` wrote). It shuffles blocks in windows, starts a new pass when
the data runs out (the Trainer would start a new epoch there too), counts tokens per source,
and can say exactly where it stands after any number of blocks.

Why windows and not `datasets`' shuffle buffer: `IterableDataset.state_dict()` records where
each source was read but not what sat in the shuffle buffer, so a run resumed from it loses
the buffered examples. Here a window of `shuffle_buffer` blocks is read, permuted with a
generator seeded by (seed, pass, window) and handed out; the state saved is the `datasets`
state at the window's start plus how many of its blocks were consumed, so a resumed run reads
the same window again, permutes it identically and continues with the next unseen block.

Why positions are computed from the step: the DataLoader, accelerate (one batch) and the
Trainer (a whole gradient-accumulation step) read ahead of what has been trained on, so the
iterator's own position is past the checkpoint. Consumed blocks are exactly
global_step x per-device batch x accumulation x processes (every process reads the same
stream: accelerate dispatches slices from process 0, or shards batches of the full stream),
and the stream keeps the state at the start of its recent windows to answer for that point.

A trainer gets all of it from `training.mixins.StreamTrainerMixin` in its bases (CausalLMTrainer has it).
"""

import json
import logging
import math
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np
import torch
from transformers.trainer_callback import TrainerState

from medrecipes.errors import UserError, bad_lines_named

logger = logging.getLogger(__name__)

STATE_FILE = "data_stream.json"
# Blocks per window when not shuffling: a resumed run reads at most this many blocks again.
UNSHUFFLED_WINDOW = 256
# How far behind the iterator a checkpoint's position may be (read-ahead), in blocks.
LOOKBACK_BLOCKS = 1 << 16


@dataclass
class _Window:
    start: int  # blocks handed out before this window, over all passes
    pass_index: int
    index: int
    inner_state: dict | None  # the datasets state before the window's first block
    tokens_before: np.ndarray  # tokens per source handed out before the window
    item_tokens: np.ndarray  # tokens per source of each block, in the order handed out


class TokenStream(torch.utils.data.IterableDataset):
    """Packed blocks ({"input_ids", "source_tokens", "source_documents"}) as an endless, resumable stream."""

    def __init__(
        self, blocks, source_names: list[str], shuffle_buffer: int = 0, seed: int = 42, files: Sequence[str] = ()
    ):
        self.blocks = blocks
        self.files = list(files)  # the local files read, to name a line that does not parse
        self.source_names = list(source_names)
        self.shuffle = shuffle_buffer > 0
        self.window_size = shuffle_buffer or UNSHUFFLED_WINDOW
        self.seed = seed
        self._start: dict | None = None
        self._windows: deque[_Window] = deque(maxlen=max(2, math.ceil(LOOKBACK_BLOCKS / self.window_size)) + 1)

    def _order(self, pass_index: int, window: int, size: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(size)
        return np.random.default_rng([self.seed, pass_index, window]).permutation(size)

    def __iter__(self):
        start = self._start or self._beginning()
        samples, skip = start["samples"] - start["skip"], start["skip"]
        pass_index, window, inner_state = start["pass"], start["window"], start["inner"]
        tokens = np.asarray(start["window_tokens"], dtype=np.int64)
        self._windows.clear()
        while True:
            self.blocks.set_epoch(pass_index)  # a state saved in another pass must not apply
            self.blocks.load_state_dict(inner_state)
            iterator, from_the_top, read = iter(self.blocks), inner_state is None, 0
            while items := self._read(iterator):
                read += len(items)
                order = self._order(pass_index, window, len(items))
                item_tokens = np.array([items[i]["source_tokens"] for i in order], dtype=np.int64)
                self._windows.append(_Window(samples, pass_index, window, inner_state, tokens, item_tokens))
                skipped = min(skip, len(items))  # blocks a resumed run has trained on already
                for i in order[skipped:]:
                    yield {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in items[i].items()}
                samples, skip, window = samples + len(items), skip - skipped, window + 1
                tokens = tokens + item_tokens.sum(axis=0)
                inner_state = self.blocks.state_dict()
            if from_the_top and not read:
                return  # no data at all
            pass_index, window, inner_state = pass_index + 1, 0, None
            logger.info("training data read to its end after %d blocks; starting pass %d", samples, pass_index + 1)

    def _read(self, iterator) -> list[dict]:
        """The next window of blocks. A file is parsed as it is read: one that does not parse
        stops the run with its first bad line (pyarrow names a row within a block of the file)."""
        with bad_lines_named(self.files):
            return list(islice(iterator, self.window_size))

    def _beginning(self) -> dict:
        zeros = [0] * len(self.source_names)
        return {
            **self._settings(),
            "samples": 0,
            "pass": 0,
            "window": 0,
            "inner": None,
            "skip": 0,
            "window_tokens": zeros,
            "tokens": zeros,
        }

    def state_at(self, samples: int) -> dict:
        """The stream's state after `samples` blocks, for a checkpoint (JSON-serialisable)."""
        window = next((w for w in reversed(self._windows) if w.start <= samples), None)
        if window is None:
            start = self._start or self._beginning()
            if samples != start["samples"]:
                raise RuntimeError(f"stream position {samples} is older than the windows kept; raise LOOKBACK_BLOCKS")
            return dict(start)
        skip = samples - window.start
        return {
            **self._settings(),
            "samples": samples,
            "pass": window.pass_index,
            "window": window.index,
            "inner": window.inner_state,
            "skip": skip,
            "window_tokens": window.tokens_before.tolist(),
            "tokens": (window.tokens_before + window.item_tokens[:skip].sum(axis=0)).tolist(),
        }

    def tokens_at(self, samples: int) -> dict[str, int]:
        """Tokens per source in the first `samples` blocks handed out."""
        counts = self.state_at(samples)["tokens"]
        return dict(zip(self.source_names, counts, strict=True))

    def _settings(self) -> dict:
        return {
            "version": 1,
            "shuffle_buffer": self.window_size if self.shuffle else 0,
            "seed": self.seed,
            "sources": self.source_names,
        }

    def load_state(self, state: dict) -> None:
        """Continue, at the next iteration, from a state that `state_at` returned."""
        for key, value in self._settings().items():
            if key != "version" and state.get(key) != value:
                raise UserError(
                    f"the checkpoint's data position was saved with {key} = {state.get(key)!r}, the recipe now "
                    f"has {value!r}; resume with the data settings the run started with"
                )
        self._start = state


def blocks_per_step(args) -> int:
    """Blocks the stream hands out per optimizer step, over all processes."""
    per_batch = args.train_batch_size
    if not (args.accelerator_config and args.accelerator_config.split_batches):
        per_batch *= args.world_size
    return per_batch * args.gradient_accumulation_steps


def restore_position(stream: TokenStream, checkpoint: str, args) -> tuple[int, int]:
    """Make `stream` continue after the blocks trained on up to `checkpoint`; returns (step, blocks)."""
    path = os.path.join(checkpoint, STATE_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            saved = json.load(f)
        stream.load_state(saved)
        logger.info("data stream resumes after %d blocks (pass %d)", saved["samples"], saved["pass"] + 1)
        return saved["step"], saved["samples"]
    # A checkpoint without the stream's position: read the stream again up to the same point,
    # as the Trainer itself would, so that nothing is replayed or skipped.
    step = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json")).global_step
    samples = step * blocks_per_step(args)
    logger.warning("%s has no %s; reading the data stream again up to block %d", checkpoint, STATE_FILE, samples)
    stream.load_state({**stream.state_at(0), "skip": samples, "samples": samples})
    return step, samples
