//! The wake descriptor's file descriptor: readable while the waker has tags
//! to drain, so an event loop (epoll, poll, asyncio's `add_reader`, libuv's
//! `uv_poll`) watches one descriptor for every attempt it drives.
//!
//! Linux: an `eventfd` (one descriptor, an 8-byte counter; writing never
//! blocks short of 2^64 - 1 rings). Elsewhere: a pipe whose read end is the
//! descriptor. Both ends are non-blocking and close-on-exec. Ringing an
//! already rung bell is harmless (the counter saturates, the pipe fills),
//! so neither ring nor clear ever blocks or fails in a way that matters.
//! loom's twin, an atomic flag, is `src/sync/loom_doorbell.rs`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[derive(Debug)]
pub(crate) struct Doorbell {
    /// The descriptor the host polls (an eventfd, or a pipe's read end).
    read: OwnedFd,
    /// The pipe's write end (`None` with an eventfd, which is both).
    #[cfg(not(target_os = "linux"))]
    write: OwnedFd,
}

impl Doorbell {
    #[cfg(target_os = "linux")]
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: a plain syscall with flags; no pointer is passed.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        let read = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { read })
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn new() -> io::Result<Self> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a writable array of two ints, as pipe(2) requires.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made by pipe(2) and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        for fd in [&read, &write] {
            set_flags(fd.as_raw_fd())?;
        }
        Ok(Self { read, write })
    }

    /// The descriptor the host polls for readability.
    pub(crate) fn fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// Makes the descriptor readable.
    pub(crate) fn ring(&self) {
        #[cfg(target_os = "linux")]
        let (fd, bytes) = (self.read.as_raw_fd(), 1u64.to_ne_bytes());
        #[cfg(not(target_os = "linux"))]
        let (fd, bytes) = (self.write.as_raw_fd(), [1u8]);
        // SAFETY: `bytes` is readable for its length; `fd` is open (owned by self).
        // EAGAIN means the bell is already rung as far as it can be: readable.
        let _ = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    }

    /// Makes the descriptor unreadable again (until the next ring).
    pub(crate) fn clear(&self) {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: `buf` is writable for its length; `fd` is open (owned by self).
            let n =
                unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            // An eventfd is emptied by one read; a pipe may need several.
            if n <= 0 || cfg!(target_os = "linux") {
                return;
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn set_flags(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor this module owns, with integer arguments only.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n == 1 && pfd.revents & libc::POLLIN != 0
    }

    #[test]
    fn rung_is_readable_until_cleared_and_rings_coalesce() {
        let bell = Doorbell::new().unwrap();
        assert!(!readable(bell.fd()));
        bell.ring();
        bell.ring();
        assert!(readable(bell.fd()));
        bell.clear();
        assert!(
            !readable(bell.fd()),
            "one clear empties any number of rings"
        );
        bell.clear(); // clearing a silent bell does not block
        bell.ring();
        assert!(readable(bell.fd()));
    }
}
