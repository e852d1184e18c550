//! Binding a listener: a Unix socket (mode 0600, a stale one replaced only
//! when nothing answers on it) or TCP. The main listener and every I/O
//! lane (`lanes.rs`) bind through here.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bulkhead_protocol::Target;

use super::ServeError;

#[derive(Debug)]
pub(crate) enum Listener {
    Unix {
        listener: tokio::net::UnixListener,
        path: PathBuf,
    },
    Tcp(tokio::net::TcpListener),
}

impl Listener {
    /// Where clients reach it (with the real port when asked for port 0).
    pub(crate) fn target(&self) -> Target {
        match self {
            Listener::Unix { path, .. } => Target::Unix(path.clone()),
            Listener::Tcp(l) => match l.local_addr() {
                Ok(addr) => Target::Tcp(addr),
                Err(_) => Target::Tcp(([0, 0, 0, 0], 0).into()),
            },
        }
    }
}

pub(crate) async fn bind(target: &Target) -> Result<Listener, ServeError> {
    match target {
        Target::Tcp(addr) => tokio::net::TcpListener::bind(addr)
            .await
            .map(Listener::Tcp)
            .map_err(|source| ServeError::Tcp {
                addr: *addr,
                source,
            }),
        Target::Unix(path) => bind_unix(path),
        Target::Named { host, .. } => Err(ServeError::ListenOnName(host.clone())),
    }
}

fn bind_unix(path: &Path) -> Result<Listener, ServeError> {
    let std_listener = bind_unix_std(path)?;
    let listener =
        tokio::net::UnixListener::from_std(std_listener).map_err(|source| ServeError::Socket {
            what: "registering",
            path: path.to_path_buf(),
            source,
        })?;
    Ok(Listener::Unix {
        listener,
        path: path.to_path_buf(),
    })
}

/// Longest Unix socket path Linux binds: `sun_path` is 108 bytes with the
/// trailing NUL.
pub(crate) const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Binds a non-blocking Unix socket at `path` (mode 0600, placed
/// atomically); needs no async runtime, so a lane binds before its thread
/// exists and a bind error is known at once.
pub(crate) fn bind_unix_std(path: &Path) -> Result<std::os::unix::net::UnixListener, ServeError> {
    let io = |what, source| ServeError::Socket {
        what,
        path: path.to_path_buf(),
        source,
    };
    // Bind under a temporary name, restrict it, then rename it into place, so
    // the socket is never reachable with the umask's looser mode.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    // The temporary name is the longer one: it must fit too.
    if tmp.as_os_str().len() > MAX_SOCKET_PATH_BYTES {
        return Err(ServeError::SocketPathTooLong {
            path: path.to_path_buf(),
            bytes: tmp.as_os_str().len(),
        });
    }
    remove_stale_socket(path)?;
    let _ = std::fs::remove_file(&tmp);
    let std_listener =
        std::os::unix::net::UnixListener::bind(&tmp).map_err(|e| io("binding", e))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("placing the socket at", e));
    }
    std_listener
        .set_nonblocking(true)
        .map_err(|e| io("configuring", e))?;
    Ok(std_listener)
}

/// A socket file this process placed, told apart from one placed later at
/// the same path by its device and inode.
#[derive(Debug)]
pub(crate) struct PlacedSocket {
    path: PathBuf,
    id: Option<(u64, u64)>,
}

impl PlacedSocket {
    pub(crate) fn at(path: &Path) -> PlacedSocket {
        PlacedSocket {
            path: path.to_path_buf(),
            id: file_id(path),
        }
    }

    /// Removes the socket if it is still ours.
    pub(crate) fn remove(&self) {
        if self.id.is_some() && file_id(&self.path) == self.id {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Removes a socket file left by a host that died, never a live one or a non-socket.
fn remove_stale_socket(path: &Path) -> Result<(), ServeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ServeError::Socket {
                what: "inspecting",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServeError::NotASocket(path.to_path_buf()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(ServeError::SocketInUse(path.to_path_buf())),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|source| ServeError::Socket {
                what: "removing the stale socket",
                path: path.to_path_buf(),
                source,
            })
        }
        Err(source) => Err(ServeError::Socket {
            what: "probing",
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_is_not_an_address_to_listen_on() {
        let target: Target = "tcp:gpu-host.internal:7070".parse().unwrap();
        let error = bind(&target).await.expect_err("a name cannot be bound");
        assert_eq!(
            error.to_string(),
            "--listen needs an address to bind (tcp:IP:PORT, e.g. tcp:0.0.0.0:7070), not the \
             name `gpu-host.internal`"
        );
    }
}
