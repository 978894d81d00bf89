#!/usr/bin/env python3
"""What writing a log costs the kernel, with and without dropping synced pages
(docs/PERFORMANCE.md, "Dropping synced pages").

Writes SIZE MiB (default 4096) to a new file under DIR (default /tmp) in 256 KiB writes,
like the log's batches, synced every 64 MiB in every mode but `plain` (EVERY_KIB in the
environment sets another interval): `sync` calls fdatasync, `dontneed` also drops the pages
synced since the last drop with posix_fadvise(POSIX_FADV_DONTNEED) as the sync thread does,
`plain` never syncs; `overwrite` first writes and syncs the file whole (not measured), then
writes it again from its start, synced, into pages that are cached and blocks that are
allocated (what reusing a log segment's file would cost); `direct` writes with O_DIRECT from
a page-aligned buffer, synced (no page cache: the device reads the buffer); `mmap` sizes the
file first (not measured), then copies into a shared mapping of it, synced, the synced pages
unmapped and dropped (what a log written through a mapping would cost: the copy is then user
time); `dontcache` writes with pwritev2(RWF_DONTCACHE) (Linux 6.14+: the write starts the
write-back of its range, and the kernel drops the pages when it completes), synced, with no
posix_fadvise. Prints the wall time, the time inside write() (or the copy), and the kernel and user
CPU time of the measured writes, and the busy time of the CPUs the process may run on (from
/proc/stat: with `taskset -c N`, what the kernel did on that core for anyone, write-back
workers and interrupts included).
Bounded: one file, removed at the end.

Usage: scripts/pagecache-bench.py plain|sync|dontneed|overwrite|direct|mmap|dontcache [SIZE_MIB] [DIR]
Run the modes alternately a few times; a fresh page costs most on a VM that hands free
memory back to its host.
"""
import mmap
import os

RWF_DONTCACHE = 0x80  # include/uapi/linux/fs.h (Linux 6.14)


def cpu_busy(cpus):
    """Busy seconds of `cpus` so far (/proc/stat: user, nice, system, irq and softirq)."""
    hz = os.sysconf("SC_CLK_TCK")
    busy = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *vals = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                v = [int(x) for x in vals]
                busy += v[0] + v[1] + v[2] + v[5] + v[6]
    return busy / hz


import resource
import sys
import time

mode = sys.argv[1]
total = int(sys.argv[2] if len(sys.argv) > 2 else 4096) << 20
path = os.path.join(sys.argv[3] if len(sys.argv) > 3 else "/tmp", f"pagecache-bench.{os.getpid()}")
chunk = 256 << 10
every = int(os.environ.get("EVERY_KIB", "65536")) << 10
if every <= 0 or every % chunk or total % every:
    sys.exit("EVERY_KIB must be a positive multiple of 256 that divides SIZE_MIB * 1024")
buf = os.urandom(chunk)
flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
if mode == "direct":
    # O_DIRECT needs an aligned buffer: an anonymous mapping is page-aligned.
    aligned = mmap.mmap(-1, chunk)
    aligned.write(buf)
    buf = aligned
    flags |= os.O_DIRECT
if mode == "mmap":
    # A shared writable mapping needs the file open for reading too.
    flags = (flags & ~os.O_WRONLY) | os.O_RDWR
fd = os.open(path, flags, 0o644)
try:
    if mode == "overwrite":
        for off in range(0, total, chunk):
            os.write(fd, buf)
        os.fdatasync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
    mapped = None
    if mode == "mmap":
        os.ftruncate(fd, total)
        mapped = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_WRITE | mmap.PROT_READ)
    cpus = os.sched_getaffinity(0)
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    busy0 = cpu_busy(cpus)
    t0 = time.perf_counter()
    in_write = 0.0
    off = 0
    while off < total:
        a = time.perf_counter()
        if mapped is not None:
            mapped[off:off + chunk] = buf
        elif mode == "dontcache":
            os.pwritev(fd, [buf], off, RWF_DONTCACHE)
        else:
            os.write(fd, buf)
        in_write += time.perf_counter() - a
        off += chunk
        if mode != "plain" and off % every == 0:
            os.fdatasync(fd)
            if mapped is not None:
                mapped.madvise(mmap.MADV_DONTNEED, off - every, every)
            if mode in ("dontneed", "mmap"):
                os.posix_fadvise(fd, off - every, every, os.POSIX_FADV_DONTNEED)
    wall = time.perf_counter() - t0
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    busy1 = cpu_busy(cpus)
finally:
    if mapped is not None:
        mapped.close()
    os.close(fd)
    os.unlink(path)
stime = usage1.ru_stime - usage0.ru_stime
utime = usage1.ru_utime - usage0.ru_utime
print(f"{mode}: {total >> 20} MiB, wall {wall:.3f} s, in write() {in_write:.3f} s, "
      f"kernel CPU {stime:.3f} s, user CPU {utime:.3f} s, "
      f"CPUs {','.join(map(str, sorted(cpus)))} busy {busy1 - busy0:.3f} s")
