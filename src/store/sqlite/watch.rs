//! Wake-ups without polling delay on SQLite: the kernel says when the
//! database's files change (inotify on their directory), whoever wrote
//! them — a producer in another process, another worker, this one. Each
//! change raises a [`Notify`]; the poller then probes for added rows at
//! once instead of at its next turn (`relay::wakeups`). Where the watch
//! cannot be set up (no inotify, a directory it may not read), workers
//! poll as on MySQL.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::Notify;

/// The size of an `inotify_event` before its name.
const HEADER: usize = 16;

/// Starts watching the directory of the database file `file` for changes
/// to the file and its WAL; `None` (and why, in the log) when it cannot.
pub(crate) fn watch(file: &Path) -> Option<Arc<Notify>> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    let name: OsString = file.file_name()?.to_owned();
    let c_dir = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: plain system calls on a descriptor this function owns; the
    // path is a valid NUL-terminated string.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if fd < 0 {
        tracing::info!(error = %std::io::Error::last_os_error(), "cannot watch the SQLite file: polling only");
        return None;
    }
    let mask = libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO;
    // SAFETY: as above.
    if unsafe { libc::inotify_add_watch(fd, c_dir.as_ptr(), mask) } < 0 {
        tracing::info!(dir = %dir.display(), error = %std::io::Error::last_os_error(), "cannot watch the SQLite file's directory: polling only");
        // SAFETY: fd is ours and open.
        unsafe { libc::close(fd) };
        return None;
    }
    let changed = Arc::new(Notify::new());
    let raise = changed.clone();
    let spawned = std::thread::Builder::new()
        .name("outboxd-sqlite-watch".into())
        .spawn(move || read_events(fd, name.as_bytes(), &raise));
    if spawned.is_err() {
        // SAFETY: fd is ours and open; the thread did not start.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(changed)
}

/// Reads inotify events from `fd` for the life of the process; raises
/// `changed` for every batch naming `name` or a file beginning with it
/// (`outbox.db`, `outbox.db-wal`).
fn read_events(fd: libc::c_int, name: &[u8], changed: &Notify) {
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reads into a buffer of the given length, owned here.
        let got = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if ours(&buf[..got as usize], name) {
            changed.notify_one();
        }
    }
}

/// Whether a batch of `inotify_event`s names `name` (or a file beginning
/// with it).
fn ours(mut events: &[u8], name: &[u8]) -> bool {
    let mut found = false;
    while events.len() >= HEADER {
        let len = u32::from_ne_bytes(events[12..16].try_into().expect("4 bytes")) as usize;
        let end = (HEADER + len).min(events.len());
        let event_name = &events[HEADER..end];
        let event_name = &event_name[..event_name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(event_name.len())];
        found |= event_name.starts_with(name);
        events = &events[end..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> Vec<u8> {
        let mut padded = name.as_bytes().to_vec();
        padded.resize(name.len().div_ceil(16) * 16 + 16, 0);
        let mut e = vec![0u8; 12];
        e.extend((padded.len() as u32).to_ne_bytes());
        e.extend(padded);
        e
    }

    #[test]
    fn only_events_naming_the_database_or_its_wal_count() {
        assert!(ours(&event("outbox.db-wal"), b"outbox.db"));
        assert!(ours(
            &[event("other"), event("outbox.db")].concat(),
            b"outbox.db"
        ));
        assert!(!ours(
            &[event("other.db-wal"), event("x")].concat(),
            b"outbox.db"
        ));
        assert!(!ours(&[], b"outbox.db"));
    }

    #[tokio::test]
    async fn a_write_to_the_file_raises_the_signal() {
        let dir = std::env::temp_dir().join(format!("outboxd-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t.db");
        let changed = watch(&file).expect("inotify works here");
        std::fs::write(dir.join("t.db-wal"), b"x").unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), changed.notified())
            .await
            .expect("the write was seen");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
