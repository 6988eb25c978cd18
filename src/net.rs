//! Dead-peer detection on the TCP connections to the database and the broker.
//!
//! A blackholed link (a dropped route, a security group, a paused VM) sends
//! no reset: without help, a call on an established connection waits until
//! the kernel gives up retransmitting, about 15 minutes. Every outgoing
//! connection of a worker is therefore *hardened*:
//!
//! - **TCP keepalive** probes an idle connection after a short idle time,
//!   so a peer that vanished while nothing was being said is noticed;
//! - **`TCP_USER_TIMEOUT`** bounds how long sent data may stay
//!   unacknowledged (probes included) before the kernel fails the socket.
//!
//! Either way the connection fails within about `dead_after`, the client
//! library sees an I/O error, and the usual reconnect path takes over.
//!
//! The AMQP connection is hardened when it is opened (the connection is
//! ours, [`crate::amqp::gate`]). sqlx opens its own sockets and exposes
//! none, so after each new database connection [`harden_connections_to`]
//! finds this process's sockets connected to the database's port that are
//! not hardened yet, and hardens them.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive, Type};

/// Keepalive and user timeout so that a dead peer is noticed within about
/// `dead_after`.
pub fn harden(fd: BorrowedFd<'_>, dead_after: Duration) -> io::Result<()> {
    let socket = SockRef::from(&fd);
    let idle = (dead_after / 2).max(Duration::from_secs(1));
    let keepalive = TcpKeepalive::new()
        .with_time(idle)
        .with_interval(Duration::from_secs(1))
        .with_retries(((dead_after.as_secs() / 2).max(1)) as u32);
    socket.set_tcp_keepalive(&keepalive)?;
    socket.set_tcp_user_timeout(Some(dead_after))
}

/// Hardens every connected TCP socket of this process whose peer port is
/// `peer_port` and that has no user timeout yet. Returns how many.
///
/// Scans `/proc/self/fd`; a descriptor closed (or reused) meanwhile is
/// skipped or, at worst, another outgoing TCP socket of ours is hardened,
/// which is harmless.
pub fn harden_connections_to(peer_port: u16, dead_after: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut hardened = 0;
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        // SAFETY: the descriptor is only borrowed for a few getsockopt /
        // setsockopt calls; if it was closed meanwhile they fail with EBADF.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        if is_unhardened_tcp_to(fd.as_fd(), peer_port) && harden(fd, dead_after).is_ok() {
            hardened += 1;
        }
    }
    hardened
}

fn is_unhardened_tcp_to(fd: BorrowedFd<'_>, peer_port: u16) -> bool {
    let socket = SockRef::from(&fd);
    socket.r#type().is_ok_and(|t| t == Type::STREAM)
        && socket
            .peer_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .is_some_and(|a| a.port() == peer_port)
        && socket.tcp_user_timeout().is_ok_and(|t| t.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_to_a_port_get_keepalive_and_a_user_timeout_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server, _) = listener.accept().unwrap();
        assert!(harden_connections_to(port, Duration::from_secs(4)) >= 1);
        let s = SockRef::from(&client);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(4)));
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(2));
        // Already hardened: left alone.
        assert_eq!(harden_connections_to(port, Duration::from_secs(9)), 0);
    }
}
