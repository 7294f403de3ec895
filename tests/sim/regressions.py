"""Every seed the delta protocol (bucket layout 4) failed while it was built, with what
it did then (one line each), replayed by the suite (tests/sim/test_regressions.py).

The seeds name histories of the harness as it was when they were found (a change to
the workload's choices changes what a seed does): they stay listed all the same. The
1155 seeds the commit-graph protocol (layouts 1-3) failed of seeds 0-2999 are in git
history (this file before the delta protocol); that protocol is gone.

Found with ``python -m bench.sim --histories N --seed-start S`` (--devices-max 8,
steps 40-120); a note is the symptoms, then the cause that was fixed.
"""

from __future__ import annotations

SEEDS: list[tuple[int, str]] = [
    (15, "diverged; an evicted page restored without its own writes, then written"),
    (16, "diverged held unavailable waiting; a restore and a listing behind skewed names"),
    (25, "held; a page held for a pack that a checkpoint it joined made unneeded"),
    (28, "diverged waiting; a checkpoint that did not hold what the best one did"),
    (34, "diverged waiting; a pack named from a listing blind to names compaction had removed"),
    (36, "unavailable; a restore whose GETs all failed said the bucket had nothing"),
    (45, "diverged waiting; a restart listing from the cursor missed a pack named behind"),
    (52, "diverged gap waiting; a restart listing from the cursor"),
    (54, "diverged waiting; a restart listing from the cursor"),
    (63, "gap; a filled spent sequence compacted with no checkpoint covering it"),
    (70, "diverged; an empty evicted page started empty though others wrote it"),
    (72, "diverged waiting; a restart listing from the cursor"),
    (78, "diverged; a pack named from a listing the monotonic clock thought fresh"),
    (80, "root-diverged; a bucket listing lagging its PUTs for hours of simulated time"),
    (93, "diverged held waiting; a restore and a restart listing"),
    (98, "diverged; a crash while making a page left it listed, empty"),
    (100, "gap; a restart listing from the cursor"),
    (121, "diverged docs-diverged waiting; a restart listing from the cursor"),
    (130, "diverged root-diverged waiting; a restart listing from the cursor"),
    (134, "gap; a compacted pack's sequence taken for spent and filled again"),
    (141, "held unavailable; a restore that could read nothing now"),
    (160, "root-diverged; own writes held in an own checkpoint marked uploaded"),
    (163, "diverged waiting; a restart listing from the cursor"),
    (167, "held unavailable; a restore that could read nothing now"),
    (178, "diverged gap; a restart listing from the cursor"),
    (198, "held unavailable; a restore that could read nothing now"),
    (201, "gap; a sequence saved before its feed time, then never filled"),
    (209, "unavailable; a restore that skipped packs held whole"),
    (242, "root-diverged; a listing an upload made hid an absence longer than the grace"),
    (250, "diverged gap unavailable; a value's index piece kept without its children"),
    (265, "unavailable; a restore that skipped packs held whole"),
    (276, "diverged; a pack named behind the newest name, passed by the cursor"),
    (302, "diverged; a device log not loaded after a restart kept its packs held"),
    (343, "diverged waiting; a device log not loaded after a restart"),
    (535, "gap; a rejoin that skipped a checkpoint it could not read now"),
    (587, "diverged; a read on a new page made it, listed and empty"),
    (1098, "unavailable; a restore racing the listing's lag said nothing was there"),
    (1139, "diverged waiting; pieces alone dropped by a join"),
    (1579, "gap; a page's cover counting a pack held whole that it did not need"),
    (1678, "diverged waiting; pieces alone dropped by a join"),
    (1737, "diverged waiting; a cover counting packs of pieces whose entries had not come"),
    (1986, "diverged docs-diverged; pieces alone dropped by a join"),
    (2104, "gap; a checkpoint written while a rejoin was pending"),
    (2123, "gap; a late first pack at a cover's top taken for a broken cover"),
    (2416, "diverged; pieces waiting for their entries collected as garbage"),
    (2443, "diverged; pieces alone dropped by a join"),
    (2496, "root-diverged; pieces alone dropped by a join"),
    (2571, "gap; a restore that did not absorb its checkpoint's cover"),
    (2589, "gap; a late first pack at a cover's top taken for a broken cover"),
    (2855, "gap; a clock set back hid an absence longer than the grace"),
    (2892, "diverged waiting; a cover counting packs of pieces whose entries had not come"),
    (2932, "gap; a clock set back hid an absence longer than the grace"),
    (5235, "diverged; a device whose every listing was whole never checked its absence"),
    (5775, "gap; a late first pack below a cover taken for a broken cover"),
    (6161, "diverged docs-diverged; a device whose every listing was whole"),
    (6230, "diverged waiting; one page's checkpoint dropped a gap another page's pack was in"),
    (7167, "diverged; a pack named below names compaction had removed"),
    (7372, "diverged index-diverged; a device whose every listing was whole"),
    (8550, "diverged; a pack named below names compaction had removed"),
    (8555, "gap; a first listing cut short by a crash, the restart not marked"),
    (8659, "gap; a failed PUT retried hours later under its old name, compacted at once"),
    (8796, "diverged docs-diverged root-diverged; a pack named below removed names"),
]
