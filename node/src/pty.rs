//! Pseudo-terminals for `kubectl exec -t`: the agent runs the exec with a
//! terminal of its own as its stdio and controlling terminal, relays the
//! terminal's bytes, and passes window sizes on to it (the kernel then
//! signals `SIGWINCH` to the process, which resizes the container's
//! terminal in turn).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::pty::OpenptFlags;
use rustix::termios::{OptionalActions, Winsize};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The master side of a pseudo-terminal. Clones share it: one may read
/// while another writes. Reads end (0 bytes) once every holder of the
/// other side has closed it and what it wrote has been read.
#[derive(Clone)]
pub struct Pty(Arc<AsyncFd<OwnedFd>>);

/// Opens a pseudo-terminal: its master side, set non-blocking, and its
/// other side in raw mode (no echo, no line editing: the bytes go through
/// as sent, whatever the program at the other end does with its terminal).
pub fn open() -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let terminal = rustix::pty::ioctl_tiocgptpeer(&master, flags)?;
    let mut modes = rustix::termios::tcgetattr(&terminal)?;
    modes.make_raw();
    // Raw mode only turns output processing off; ctr turns it back on
    // (containerd's console keeps `OPOST`), so newline translation goes
    // too, or a container's "\r\n" would arrive as "\r\r\n".
    modes.output_modes.remove(rustix::termios::OutputModes::ONLCR);
    rustix::termios::tcsetattr(&terminal, OptionalActions::Now, &modes)?;
    let status = rustix::fs::fcntl_getfl(&master)?;
    rustix::fs::fcntl_setfl(&master, status | OFlags::NONBLOCK)?;
    Ok((master, terminal))
}

impl Pty {
    /// Spawns `command` with a new terminal as its stdin, stdout, stderr
    /// and controlling terminal (the last through util-linux's `setsid
    /// --ctty`, which this crate's no-`unsafe` rule leaves to a program:
    /// it takes a new session and the terminal between fork and exec).
    /// Only the program, arguments, environment and directory of `command`
    /// are kept. The child's exit status is the program's.
    pub fn spawn(command: &tokio::process::Command) -> io::Result<(Pty, tokio::process::Child)> {
        let (master, terminal) = open()?;
        let original = command.as_std();
        let mut wrapped = tokio::process::Command::new("setsid");
        wrapped.args(["--ctty", "--wait"]).arg(original.get_program()).args(original.get_args());
        for (key, value) in original.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = original.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
            .stdin(std::process::Stdio::from(terminal.try_clone()?))
            .stdout(std::process::Stdio::from(terminal.try_clone()?))
            .stderr(std::process::Stdio::from(terminal))
            .kill_on_drop(true);
        let child = wrapped.spawn()?;
        // `wrapped` goes, and with it this process's copies of the terminal.
        Ok((Pty::new(master)?, child))
    }

    /// Wraps the master side of a terminal (non-blocking, as [`open`] sets it).
    pub fn new(master: OwnedFd) -> io::Result<Pty> {
        // `new` is deprecated because a `T` that does not own its fd could
        // let the fd close while registered; an `OwnedFd` cannot, and the
        // replacement (`register`) is `unsafe`, which this crate forbids.
        #[allow(deprecated)]
        let fd = AsyncFd::new(master)?;
        Ok(Pty(Arc::new(fd)))
    }

    /// Sets the terminal's window size, as a terminal emulator does when
    /// its window changes.
    pub fn resize(&self, columns: u16, rows: u16) -> io::Result<()> {
        let size = Winsize { ws_row: rows, ws_col: columns, ws_xpixel: 0, ws_ypixel: 0 };
        Ok(rustix::termios::tcsetwinsize(self.0.get_ref(), size)?)
    }
}

impl AsFd for Pty {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.get_ref().as_fd()
    }
}

impl AsyncRead for Pty {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            // EIO is how a master learns the other side has closed.
            let read = guard.try_io(|fd| match rustix::io::read(fd.get_ref(), &mut *unfilled) {
                Err(Errno::IO) => Ok(0),
                other => other.map_err(io::Error::from),
            });
            match read {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Pty {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(io::Error::from)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_child_gets_a_terminal_its_size_and_our_input() {
        let mut command = tokio::process::Command::new("sh");
        command.args(["-c", "read line; [ -t 0 ] && echo tty; stty size; echo \"got $line\"; exit 7"]);
        let (mut pty, mut child) = Pty::spawn(&command).unwrap();
        pty.resize(132, 43).unwrap();
        pty.write_all(b"hello\n").await.unwrap();
        let mut out = Vec::new();
        pty.read_to_end(&mut out).await.unwrap();
        let out = String::from_utf8_lossy(&out);
        assert_eq!(out.lines().collect::<Vec<_>>(), ["tty", "43 132", "got hello"], "{out:?}");
        assert_eq!(child.wait().await.unwrap().code(), Some(7));
    }
}
