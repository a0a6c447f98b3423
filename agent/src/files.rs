//! Opening what the command line names without ever blocking: a FIFO (or a
//! device) given as `--nodes-file` or `--netns` would hang a plain `open` or
//! `read` forever. Files are opened with `O_NONBLOCK`, checked with `fstat`
//! and read with a bound.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Largest nodes file the agent reads (a 5000-node cluster is ~1 MiB).
pub const MAX_NODES_FILE: u64 = 16 << 20;

fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// Opens `path` read-only without blocking and refuses anything but a
/// regular file (namespace files from `/run/netns` and `/proc/*/ns/net` are
/// regular files too).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)?;
    let file_type = file.metadata()?.file_type();
    if file_type.is_file() {
        Ok(file)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a regular file",
                path.display(),
                kind(file_type)
            ),
        ))
    }
}

/// Reads a regular file of at most [`MAX_NODES_FILE`] bytes as UTF-8.
pub fn read_bounded(path: &Path) -> io::Result<String> {
    let file = open_regular(path)?;
    let mut text = String::new();
    file.take(MAX_NODES_FILE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_NODES_FILE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is larger than {MAX_NODES_FILE} bytes", path.display()),
        ));
    }
    Ok(text)
}

/// Opens a network namespace file (`--netns`) without blocking: a regular
/// file first, then a network namespace (checked by the plugin's helper on
/// the already open descriptor).
pub fn open_netns(path: &Path) -> io::Result<File> {
    let file = open_regular(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{e}: --netns must name a network namespace (/run/netns/NAME)"),
        )
    })?;
    let by_fd = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file));
    cnilab_net::netns::open_network_namespace(&by_fd).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a network namespace", path.display()),
        )
    })
}
