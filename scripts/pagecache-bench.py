#!/usr/bin/env python3
"""What writing a log costs the kernel, with and without dropping synced pages
(docs/PERFORMANCE.md, "Dropping synced pages").

Writes SIZE MiB (default 4096) to a new file under DIR (default /tmp) in 256 KiB writes,
like the log's batches; `sync` calls fdatasync every 64 MiB, `dontneed` also drops the
synced pages with posix_fadvise(POSIX_FADV_DONTNEED) as the sync thread does, `plain` never
syncs; `overwrite` first writes and syncs the file whole (not measured), then writes it again
from its start, synced every 64 MiB, into pages that are cached and blocks that are
allocated (what reusing a log segment's file would cost); `direct` writes with O_DIRECT
from a page-aligned buffer, synced every 64 MiB (no page cache: the device reads the
buffer). Prints the wall time, the time inside write() and the kernel CPU time of the
measured writes.
Bounded: one file, removed at the end.

Usage: scripts/pagecache-bench.py plain|sync|dontneed|overwrite|direct [SIZE_MIB] [DIR]
Run the modes alternately a few times; a fresh page costs most on a VM that hands free
memory back to its host.
"""
import mmap
import os
import resource
import sys
import time

mode = sys.argv[1]
total = int(sys.argv[2] if len(sys.argv) > 2 else 4096) << 20
path = os.path.join(sys.argv[3] if len(sys.argv) > 3 else "/tmp", f"pagecache-bench.{os.getpid()}")
chunk = 256 << 10
every = 64 << 20
buf = os.urandom(chunk)
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
if mode == "direct":
    # O_DIRECT needs an aligned buffer: an anonymous mapping is page-aligned.
    aligned = mmap.mmap(-1, chunk)
    aligned.write(buf)
    buf = aligned
    flags |= os.O_DIRECT
fd = os.open(path, flags, 0o644)
try:
    if mode == "overwrite":
        for off in range(0, total, chunk):
            os.write(fd, buf)
        os.fdatasync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
    stime0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
    t0 = time.perf_counter()
    in_write = 0.0
    off = 0
    while off < total:
        a = time.perf_counter()
        os.write(fd, buf)
        in_write += time.perf_counter() - a
        off += chunk
        if mode != "plain" and off % every == 0:
            os.fdatasync(fd)
            if mode == "dontneed":
                os.posix_fadvise(fd, 0, off, os.POSIX_FADV_DONTNEED)
    wall = time.perf_counter() - t0
finally:
    os.close(fd)
    os.unlink(path)
stime = resource.getrusage(resource.RUSAGE_SELF).ru_stime - stime0
print(f"{mode}: {total >> 20} MiB, wall {wall:.3f} s, in write() {in_write:.3f} s, kernel CPU {stime:.3f} s")
