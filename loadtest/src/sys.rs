//! Operating-system odds and ends: the open-file limit, a process's RSS, and outgoing sockets
//! bound to a chosen loopback source address.
//!
//! Owns the unsafe `libc` calls and socket options; knows nothing about WebSocket or scenarios.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "CPU number too large",
        ));
    }
    // SAFETY: cpu_set_t is plain data for which all-zero is the empty set; CPU_SET writes
    // inside it because `cpu` < CPU_SETSIZE (checked above); sched_setaffinity(0, ..) reads
    // the set we own and applies to the calling thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Raise RLIMIT_NOFILE's soft limit to the hard limit. Returns (old soft, new soft).
pub fn raise_nofile() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
    let old = lim.rlim_cur as u64;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads the struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    #[allow(clippy::unnecessary_cast)]
    let new = lim.rlim_cur as u64;
    Ok((old, new))
}

/// The calling thread's time on a CPU and time waiting for one (run delay), ns, from
/// `/proc/thread-self/schedstat`; `None` where the kernel does not keep it.
pub fn thread_schedstat() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut f = s.split_ascii_whitespace().map(|v| v.parse::<u64>().ok());
    Some((f.next()??, f.next()??))
}

/// VmRSS of `pid` in KiB, from `/proc/<pid>/status`.
pub fn vm_rss_kib(pid: u32) -> io::Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_vm_rss(&s).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no VmRSS line"))
}

/// CPU seconds (user + system) a process has used, from /proc/<pid>/stat.
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    parse_cpu_ticks(&s)
        .map(|t| t as f64 / hz)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc/<pid>/stat"))
}

/// utime + stime (fields 14 and 15) of a /proc/<pid>/stat line; the command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, so index 11.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The `i`-th source address when spreading over `n` addresses 127.0.0.2, 127.0.0.3, ...
/// `None` when not spreading (n = 0) or when the target is not IPv4 loopback.
pub fn source_ip(target: &SocketAddr, n: u32, i: usize) -> Option<IpAddr> {
    if n == 0 || !matches!(target.ip(), IpAddr::V4(v4) if v4.octets()[0] == 127) {
        return None;
    }
    let k = 2 + (i as u32 % n);
    // 127.0.0.2 .. 127.255.255.254
    let host = k.min(0x00ff_fffe);
    Some(IpAddr::V4(Ipv4Addr::from(0x7f00_0000 | host)))
}

/// A non-blocking TCP socket connecting to `target`, optionally bound to `src` first.
///
/// With a source address the socket sets IP_BIND_ADDRESS_NO_PORT, so the port is picked at
/// connect time per (source, destination) pair and every source address gives a full
/// ephemeral-port range.
pub fn connect(target: &SocketAddr, src: Option<IpAddr>) -> io::Result<std::net::TcpStream> {
    let domain = if target.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::new(
        domain,
        Type::STREAM.nonblocking().cloexec(),
        Some(Protocol::TCP),
    )?;
    sock.set_nodelay(true)?;
    if let Some(ip) = src {
        set_bind_no_port(&sock);
        sock.bind(&SocketAddr::new(ip, 0).into())?;
    }
    match sock.connect(&(*target).into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(sock.into())
}

fn set_bind_no_port(sock: &Socket) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: a valid fd and a c_int option value of the right size. Failure only loses the
    // port-sharing optimisation, so the result is ignored.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Make the next close of this socket send a RST instead of a FIN (no TIME_WAIT).
pub fn set_linger_zero(stream: &mio::net::TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(std::time::Duration::ZERO));
}

/// Set the nice value of the calling thread (Linux: per thread) and, when `slice_ns` > 0,
/// its EEVDF time slice (`sched_attr.sched_runtime`, Linux 6.12+, 0.1 to 100 ms): a thread
/// with a short slice gives the core back to another runnable thread after that long.
/// Raising the nice value and choosing a slice need no privilege.
pub fn nice_current_thread(nice: i32, slice_ns: u64) -> io::Result<()> {
    /// `struct sched_attr`, SCHED_ATTR_SIZE_VER0 (48 bytes).
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }
    if slice_ns > 0 {
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: libc::SCHED_OTHER as u32,
            flags: 0,
            nice,
            priority: 0,
            runtime: slice_ns,
            deadline: 0,
            period: 0,
        };
        // SAFETY: sched_setattr(0 = this thread, a valid sched_attr of the size it names, 0).
        let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
        if r == 0 {
            return Ok(());
        }
    }
    // SAFETY: plain syscalls on the calling thread's id.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if slice_ns > 0 {
        return Err(io::Error::other(
            "the nice value is set, but not the time slice",
        ));
    }
    Ok(())
}

/// Puts the calling thread under SCHED_IDLE (Linux: per thread; no privilege needed): it
/// runs only when no other thread of its CPU is runnable, and any wakeup of one preempts it.
pub fn idle_current_thread() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(0 = this thread, SCHED_IDLE, a valid sched_param).
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The 1-minute load average from /proc/loadavg (None if unreadable).
pub fn loadavg1() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_from_stat() {
        let stat = "1234 (wallet relay) S 1 1234 1234 0 -1 4194560 500 0 0 0 150 25 0 0 20 0 3 0";
        assert_eq!(parse_cpu_ticks(stat), Some(175));
        assert_eq!(parse_cpu_ticks("1234 (x) S 1 2"), None);
    }

    #[test]
    fn vm_rss_line() {
        let s = "Name:\tx\nVmPeak:\t  100 kB\nVmRSS:\t   20480 kB\nThreads:\t1\n";
        assert_eq!(parse_vm_rss(s), Some(20480));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }

    #[test]
    fn own_rss_is_readable() {
        assert!(vm_rss_kib(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn source_addresses_spread() {
        let t: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert_eq!(source_ip(&t, 0, 5), None);
        assert_eq!(source_ip(&t, 3, 0), Some("127.0.0.2".parse().unwrap()));
        assert_eq!(source_ip(&t, 3, 4), Some("127.0.0.3".parse().unwrap()));
        assert_eq!(source_ip(&t, 300, 299), Some("127.0.1.45".parse().unwrap()));
        let t6: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(source_ip(&t6, 3, 0), None);
    }
}

/// A one-shot `timerfd` on `CLOCK_MONOTONIC` (the clock `Instant` reads): the event loop's
/// wake-up when its next send is closer than epoll's whole milliseconds, instead of spinning.
#[derive(Debug)]
pub struct Timer {
    fd: std::os::fd::OwnedFd,
}

impl Timer {
    /// A disarmed timer, non-blocking, close-on-exec.
    pub fn new() -> io::Result<Timer> {
        // SAFETY: timerfd_create takes two integers and returns a new descriptor or -1.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by timerfd_create and is owned by nothing else.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Timer { fd })
    }

    /// The descriptor, for registering with the poll.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// Fire once, `after` from now (at least 1 ns: zero would disarm it).
    pub fn arm(&self, after: std::time::Duration) -> io::Result<()> {
        let after = after.max(std::time::Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec we own; the old value is not asked for (null).
        let r = unsafe { libc::timerfd_settime(self.raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Let this thread's timers fire within `ns` of when they are due (the default slack is
/// 50 µs), so a timed wake-up is a send on time.
pub fn set_timer_slack_ns(ns: u64) {
    // SAFETY: prctl(PR_SET_TIMERSLACK) takes integers and changes only this thread's slack.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
}
