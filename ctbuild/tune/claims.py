"""Which measuring process tunes which key, with several GPUs: the first lane to claim it.

Every lane's process is given every key, longest first (`ctbuild.tune.fleet`), and claims each
before tuning it: a file named after the key's index, in a directory of the supervisor's own,
holding the lane's number. A key another lane claimed is skipped. So a lane that is done early
takes the next key instead of idling while another works through a share fixed in advance by
cost estimates, which are off by tens of percent: the lanes end within about one key of each
other. A process restarted after its predecessor died finds that lane's claims and keeps them.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


class Claims:
    """The claims directory as seen by lane ``lane``."""

    def __init__(self, path: str | Path, lane: int) -> None:
        self.path, self.lane = Path(path), lane

    def take(self, index: int) -> bool:
        """Whether this lane tunes entry ``index``: it claims it now, or had claimed it. The
        claim is linked into place with its content, so no lane ever reads half of one."""
        fd, tmp = tempfile.mkstemp(prefix=".claim-", dir=self.path)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(str(self.lane))
            os.link(tmp, self.path / str(index))
            return True
        except FileExistsError:
            return self.owner(index) == self.lane
        finally:
            os.unlink(tmp)

    def owner(self, index: int) -> int | None:
        """The lane that claimed entry ``index`` (None: no lane yet)."""
        try:
            return int((self.path / str(index)).read_text())
        except FileNotFoundError:
            return None

    def open_to_me(self, index: int) -> bool:
        """Whether entry ``index`` is unclaimed or this lane's."""
        return self.owner(index) in (None, self.lane)
