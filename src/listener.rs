//! Client listeners on a Unix socket (`listen = "unix:PATH"`): the socket
//! file made at start (a stale one replaced, a live one or any other file
//! refused), its mode (`listen_mode`), and its removal when the listener
//! closes; and the stream of a client accepted on either kind of listener.

use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// What is at a Unix listener's path before memring binds it.
#[derive(Debug, PartialEq, Eq)]
pub enum SocketPath {
    /// Nothing: the socket is made there.
    Free,
    /// A socket nobody listens on (connecting is refused): left by a
    /// process that ended without removing it; it is replaced.
    Stale,
    /// A socket another process listens on.
    Live,
}

/// What is at `path`, or why a listener cannot be made there (its
/// directory missing, or a file that is not a socket, which memring never
/// removes).
///
/// # Errors
/// The message says what is wrong with the path.
pub fn socket_path(path: &Path) -> io::Result<SocketPath> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    if !parent.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("directory {} does not exist", parent.display()),
        ));
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(SocketPath::Free),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; memring does not remove it",
                path.display()
            ),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Ok(SocketPath::Live),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(SocketPath::Stale),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot tell whether {} is in use: {e}", path.display()),
        )),
    }
}

/// Binds a Unix-socket listener at `path`, replacing a stale socket file,
/// and gives the file `mode` (else what the umask leaves).
///
/// # Errors
/// The path's directory is missing, a file that is not a socket is there,
/// another process listens on it, or the bind or the `chmod` fails.
pub(crate) fn bind_unix(
    path: &Path,
    mode: Option<u32>,
) -> io::Result<(tokio::net::UnixListener, SocketFile)> {
    match socket_path(path)? {
        SocketPath::Free => {}
        SocketPath::Stale => {
            tracing::info!(path = %path.display(), "replacing a stale socket file (nothing listens on it)");
            std::fs::remove_file(path)?;
        }
        SocketPath::Live => {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "in use: another process listens on this socket",
            ))
        }
    }
    let listener = match mode {
        None => tokio::net::UnixListener::bind(path)?,
        Some(mode) => bind_with_mode(path, mode)?,
    };
    let file = SocketFile::made(path)?;
    Ok((listener, file))
}

/// Binds at a temporary name beside `path`, gives the file `mode`, then
/// renames it to `path`: no client can connect to it under the umask's mode
/// first. A path too long for the temporary name is bound and then given
/// its mode.
fn bind_with_mode(path: &Path, mode: u32) -> io::Result<tokio::net::UnixListener> {
    let permissions = || std::fs::Permissions::from_mode(mode);
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.new", std::process::id()));
    let temporary = PathBuf::from(temporary);
    if temporary.as_os_str().len() > MAX_UNIX_PATH_BYTES {
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, permissions())?;
        return Ok(listener);
    }
    // Only this process makes that name; one left by an earlier process
    // with the same id is stale.
    if std::fs::symlink_metadata(&temporary).is_ok_and(|m| m.file_type().is_socket()) {
        std::fs::remove_file(&temporary)?;
    }
    let listener = tokio::net::UnixListener::bind(&temporary)?;
    let placed = std::fs::set_permissions(&temporary, permissions())
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(e);
    }
    Ok(listener)
}

/// The longest path a Unix socket may have (`sun_path`, less its NUL).
const MAX_UNIX_PATH_BYTES: usize = 107;

/// The socket file a listener made, removed when the listener closes (at
/// shutdown, or when start-up fails after binding it), unless another file
/// has taken its place meanwhile.
pub(crate) struct SocketFile {
    path: PathBuf,
    /// Device and inode of the file made, to remove only that one.
    id: (u64, u64),
}

impl SocketFile {
    fn made(path: &Path) -> io::Result<SocketFile> {
        let meta = std::fs::symlink_metadata(path)?;
        Ok(SocketFile {
            path: path.to_path_buf(),
            id: (meta.dev(), meta.ino()),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.id);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(path = %self.path.display(), "cannot remove the socket file: {e}");
            }
        }
    }
}

/// A client accepted on a TCP or a Unix-socket listener.
pub(crate) enum ClientStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}
