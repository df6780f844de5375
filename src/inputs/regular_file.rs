//! Reads the control plane's own files (the config, certificates, keys) with
//! limits: only a regular file, and at most a given number of bytes. A file
//! swapped for a FIFO would block its reader until a writer appears, and one
//! swapped for `/dev/zero` would grow memory until the process dies; both are
//! refused here at once, with words that say which limit was hit. Blocking
//! calls only: callers run them off the accept path and off the workers.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Largest config file read (a config with thousands of servers and
/// comments is well under 1 MiB).
pub const MAX_CONFIG_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// Largest certificate, key or CA file read (a full public CA bundle is
/// about 200 KiB).
pub const MAX_TLS_FILE_BYTES: u64 = 1024 * 1024;

/// The bytes of the regular file at `path` (symlinks followed), at most
/// `limit` of them.
///
/// The file is opened with `O_NONBLOCK`, so that opening a FIFO does not wait
/// for a writer, and what was opened is checked (`fstat` on the open file,
/// not a `stat` of the path that could be swapped in between) before a byte
/// is read.
///
/// # Errors
/// The file cannot be opened or read; it is not a regular file (a FIFO, a
/// device, a socket; a directory is `EISDIR`, as `read` says of one); or it
/// holds more than `limit` bytes.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    if metadata.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    if !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a regular file ({}); memring reads only regular files",
                kind(&metadata)
            ),
        ));
    }
    if metadata.len() > limit {
        return Err(too_large(limit));
    }
    read_at_most(file, metadata.len(), limit)
}

/// [`read`], as UTF-8 text.
///
/// # Errors
/// As [`read`]; also text that is not UTF-8.
pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Reads to the end, but never more than `limit` bytes: a regular file may
/// grow while it is read.
fn read_at_most(file: File, expected: u64, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

fn too_large(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("larger than the limit of {limit} bytes for this file; refused"),
    )
}

fn kind(metadata: &Metadata) -> &'static str {
    let file_type = metadata.file_type();
    if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "memring-regular-file-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_regular_file_within_the_limit_is_read() {
        let dir = dir("ok");
        let path = dir.join("f");
        std::fs::write(&path, b"hello").unwrap();
        assert_eq!(read(&path, 5).unwrap(), b"hello");
        let error = read(&path, 4).unwrap_err();
        assert!(error.to_string().contains("limit of 4 bytes"), "{error}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_without_blocking() {
        let error = read(Path::new("/dev/zero"), 1024).unwrap_err();
        assert!(error.to_string().contains("a character device"), "{error}");
        let error = read(Path::new("/"), 1024).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EISDIR), "{error}");
        let dir = dir("fifo");
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // No writer: a plain open would block here for ever.
        let error = read(&fifo, 1024).unwrap_err();
        assert!(error.to_string().contains("a FIFO"), "{error}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
