//! The host's knobs the server turns: the open-file limit and transparent huge pages (for
//! the process, from `main`), the socket options every accepted connection inherits from its
//! listener, and the BPF program that steers a connection to the worker pinned to the CPU
//! that received it (`--cpu-steering`).

use std::io;
use std::os::fd::AsRawFd;

/// Raises the soft open-file limit to the hard limit; returns the new soft limit.
pub fn raise_nofile_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or write the struct we pass, which lives on
    // this stack frame for the duration of each call.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return None;
        }
        if rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
                return None;
            }
        }
    }
    Some(rl.rlim_cur)
}

/// Turns transparent huge pages off for this process (`PR_SET_THP_DISABLE`). The kernel
/// checks the flag at each page fault, so later faults in memory mapped before the call are
/// covered too; pages already faulted stay as they are. A huge page is cleared whole on its
/// first touch, which stalls the faulting worker for milliseconds, and a growing message
/// cache does that many times a second: with huge pages, those stalls are the p99 tail.
pub fn disable_huge_pages() -> io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers (no pointers); the call changes a
    // flag of this process's memory map and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets `SO_BUSY_POLL` (microseconds) on a socket; errors are ignored (needs privileges
/// on some kernels).
pub fn set_busy_poll(sock: &impl AsRawFd, us: u32) {
    set_int_opt(sock, libc::SOL_SOCKET, libc::SO_BUSY_POLL, us);
}

/// Sets `TCP_NOTSENT_LOWAT` (bytes) on a socket; errors are ignored (Linux >= 3.12).
/// With it, a write returns `EAGAIN` once this many bytes wait unsent in the kernel, so a
/// client that stops reading holds its receive window plus this much, not a whole send
/// buffer, and the server stops spending writes on it that much sooner.
pub fn set_notsent_lowat(sock: &impl AsRawFd, bytes: u32) {
    set_int_opt(sock, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, bytes);
}

/// `setsockopt` of one `c_int` (values above `i32::MAX` are clamped); errors are ignored.
fn set_int_opt(sock: &impl AsRawFd, level: libc::c_int, name: libc::c_int, value: u32) {
    let _ = setsockopt_int(sock, level, name, value.min(i32::MAX as u32) as libc::c_int);
}

/// `setsockopt` of one `c_int`.
fn setsockopt_int(
    sock: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a pointer to a live local
    // c_int; the fd is owned by `sock`, which outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Attaches to a `SO_REUSEPORT` group a classic BPF program returning, for the CPU that
/// handles the incoming SYN, the index of the listener whose worker is pinned to that CPU
/// (listeners are indexed in bind order, which is worker order). A CPU with no worker
/// returns an index out of range, which makes the kernel fall back to its hash.
pub fn attach_cpu_steering(sock: &impl AsRawFd, worker_cpus: &[usize]) -> io::Result<()> {
    // From <asm-generic/socket.h>; libc does not export it for every target.
    const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
    // Opcodes of <linux/bpf_common.h>: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K,
    // BPF_RET|BPF_K (BPF_LD, BPF_W and BPF_K are 0).
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
    const BPF_RET_K: u16 = 0x06;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut prog = vec![op(
        BPF_LD_W_ABS,
        0,
        0,
        (libc::SKF_AD_OFF + libc::SKF_AD_CPU) as u32,
    )];
    for (i, &cpu) in worker_cpus.iter().enumerate() {
        prog.push(op(BPF_JMP_JEQ_K, 0, 1, cpu as u32));
        prog.push(op(BPF_RET_K, 0, 0, i as u32));
    }
    prog.push(op(BPF_RET_K, 0, 0, u32::MAX));
    if prog.len() > 4096 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many workers for a BPF program",
        ));
    }
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: the kernel copies `len` instructions from `filter`, which points into `prog`,
    // alive until after the call; `fprog` is a valid `sock_fprog` for the given size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Takes a `--cpu-steering` program off a `SO_REUSEPORT` group (a process taking over the
/// group from one that steered, without `--cpu-steering` itself); none attached is fine.
pub fn detach_cpu_steering(sock: &impl AsRawFd) -> io::Result<()> {
    // From <asm-generic/socket.h>.
    const SO_DETACH_REUSEPORT_BPF: libc::c_int = 68;
    // The option ignores its value.
    match setsockopt_int(sock, libc::SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, 0) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        done => done,
    }
}
