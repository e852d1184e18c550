//! Binding the listener: a Unix socket (mode 0600, a stale one replaced only
//! when nothing answers on it) or TCP.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
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
    }
}

fn bind_unix(path: &Path) -> Result<Listener, ServeError> {
    let io = |what, source| ServeError::Socket {
        what,
        path: path.to_path_buf(),
        source,
    };
    remove_stale_socket(path)?;
    // Bind under a temporary name, restrict it, then rename it into place, so
    // the socket is never reachable with the umask's looser mode.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
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
    let listener =
        tokio::net::UnixListener::from_std(std_listener).map_err(|e| io("registering", e))?;
    Ok(Listener::Unix {
        listener,
        path: path.to_path_buf(),
    })
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
