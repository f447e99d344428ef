"""The claims that hand a fleet's keys to its lanes (`ctbuild.tune.claims`), raced by real
processes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ctbuild.tune.claims import Claims

#: One lane's process: claims every index in order, prints those it got.
LANE = r'''
import json, sys
from ctbuild.tune.claims import Claims
claims = Claims(sys.argv[1], int(sys.argv[2]))
print(json.dumps([i for i in range(int(sys.argv[3])) if claims.take(i)]))
'''


def test_racing_lanes_claim_every_key_once(tmp_path: Path) -> None:
    """Four processes claiming the same 300 keys at once: each key goes to exactly one, and
    its owner is the lane that got it."""
    procs = [subprocess.Popen([sys.executable, "-c", LANE, str(tmp_path), str(lane), "300"],
                              stdout=subprocess.PIPE, text=True) for lane in range(4)]
    got = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert sorted(i for mine in got for i in mine) == list(range(300))
    view = Claims(tmp_path, 0)
    assert all(view.owner(i) == lane for lane, mine in enumerate(got) for i in mine)
    assert not [p.name for p in tmp_path.iterdir() if not p.name.isdigit()]  # no temp files


def test_a_lane_keeps_its_claims_and_yields_others(tmp_path: Path) -> None:
    """A restarted process of the same lane takes its own claims again; another lane's are
    not open to it; an unclaimed key is."""
    first, again, other = Claims(tmp_path, 1), Claims(tmp_path, 1), Claims(tmp_path, 2)
    assert first.owner(7) is None and other.open_to_me(7)
    assert first.take(7) and again.take(7) and not other.take(7)
    assert first.owner(7) == 1 and again.open_to_me(7) and not other.open_to_me(7)
