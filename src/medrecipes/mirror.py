"""A copy of every checkpoint in object storage (any fsspec URL), made in the background.

A rented machine's disk goes with the machine. Each saved checkpoint is snapshotted with hard
links (instant, no extra space, and immune to retention deleting the folder meanwhile) and
copied by one worker thread, in order, while training goes on. A copy is complete when its
`COMPLETE` marker exists: the marker is written after every file, because object stores have
no atomic folder rename to publish a copy with.
"""

import json
import logging
import os
import queue
import shutil
import threading
import time

import fsspec

from medrecipes.errors import UserError

logger = logging.getLogger(__name__)

COMPLETE = "_COMPLETE"
SNAPSHOTS = "_snapshots"  # under output_dir; the leading underscore keeps HF's Hub push off it


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a filesystem without hard links
        shutil.copy2(src, dst)


def snapshot_folder(folder: str, ignore=None) -> str:
    """A hard-linked copy of `folder` under its parent's `_snapshots/`, which stays valid when
    `folder` itself is deleted; returns its path."""
    parent, name = os.path.split(os.path.abspath(folder))
    target = os.path.join(parent, SNAPSHOTS, f"{name}-{time.monotonic_ns()}")
    shutil.copytree(folder, target, copy_function=_link_or_copy, ignore=ignore)
    return target


def copy_to_url(local_dir: str, url: str) -> None:
    """Copy the files of `local_dir` into the folder `url` (fsspec: s3://, gs://, file://, ...).

    Kept to this signature so that one copy-to-storage function can serve both the mirror and data.
    """
    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    files = [
        os.path.relpath(os.path.join(folder, name), local_dir)
        for folder, _, names in os.walk(local_dir)
        for name in names
    ]
    targets = [f"{root}/{f.replace(os.sep, '/')}" for f in files]
    # A local or mounted filesystem needs each folder made first; object stores ignore this.
    for folder in sorted({target.rsplit("/", 1)[0] for target in targets} | {root}):
        fs.makedirs(folder, exist_ok=True)
    fs.put([os.path.join(local_dir, f) for f in files], targets)


def mark_complete(url: str) -> None:
    """Write the marker that says the copy at `url` holds every file."""
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root.rstrip('/')}/{COMPLETE}", json.dumps({"time": time.time()}).encode())


class BackgroundMirror:
    """Copies folders to `url`/<folder name> on a worker thread, one after another."""

    def __init__(self, url: str):
        try:  # an unknown protocol, a missing driver or a server that is not there fails now, not hours in
            fsspec.core.url_to_fs(url)
        except (OSError, ValueError) as err:  # a refused connection, a host that is not there, a port past 65535
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise UserError(
                f"checkpoint_mirror_url {url}: cannot reach it ({why}); check the address, the server and the "
                "network, or leave checkpoint_mirror_url out"
            ) from None
        self.url = url.rstrip("/")
        self.copied: list[str] = []
        self.failed: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, folder: str) -> None:
        name = os.path.basename(os.path.normpath(folder))
        self._queue.put((name, snapshot_folder(folder)))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="checkpoint-mirror", daemon=True)
            self._thread.start()

    def wait(self) -> None:
        """Block until every submitted folder is copied (or has failed)."""
        if self._queue.unfinished_tasks:
            logger.info("waiting for %d checkpoint copies to %s", self._queue.unfinished_tasks, self.url)
        self._queue.join()

    def _work(self) -> None:
        while True:
            name, snapshot = self._queue.get()
            target = f"{self.url}/{name}"
            try:
                copy_to_url(snapshot, target)
                mark_complete(target)
                self.copied.append(name)
                logger.info("%s copied to %s", name, target)
            except Exception as err:  # a failed copy must not end a training run; it is reported
                self.failed.append(name)
                logger.error("copying %s to %s failed: %s", name, target, err)
            finally:
                shutil.rmtree(snapshot, ignore_errors=True)
                self._queue.task_done()
