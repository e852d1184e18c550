//! The test Redis (127.0.0.1:6379, `BULKHEAD_TEST_REDIS` overrides): a key
//! prefix per test, deleted when done, and a proxy that can cut it off.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Where the test Redis listens.
pub fn redis_addr() -> String {
    std::env::var("BULKHEAD_TEST_REDIS").unwrap_or_else(|_| "127.0.0.1:6379".into())
}

/// A key prefix no other test (or run) uses.
pub fn prefix(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("bh-e2e-{test}-{}-{nanos}", std::process::id())
}

/// Deletes every key under the prefix when dropped.
#[derive(Debug)]
pub struct Keys(pub String);

impl Drop for Keys {
    fn drop(&mut self) {
        let keys = redis(&["KEYS", &format!("{}:*", self.0)]);
        let names: Vec<&str> = keys.lines().filter(|l| l.starts_with(&self.0)).collect();
        if !names.is_empty() {
            let mut command = vec!["DEL"];
            command.extend(names);
            redis(&command);
        }
    }
}

/// One command to the test Redis (then `QUIT`, so the reply ends); the
/// raw RESP reply.
pub fn redis(args: &[&str]) -> String {
    let mut conn = TcpStream::connect(redis_addr()).expect("the test Redis answers");
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    request.push_str("*1\r\n$4\r\nQUIT\r\n");
    conn.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    reply
}

/// A TCP proxy to Redis that can cut every connection and refuse new ones
/// (a dead Redis, a cut network) and then pass traffic again.
#[derive(Debug)]
pub struct Proxy {
    pub addr: String,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let upstream = upstream.to_string();
        let (flag, conns) = (Arc::clone(&cut), Arc::clone(&open));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if flag.load(Ordering::Acquire) {
                    // Refused: closed at once.
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let mut open = conns.lock().unwrap();
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Proxy { addr, cut, open }
    }

    /// Closes every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        for conn in self.open.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::Release);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buffer = [0_u8; 16 << 10];
        while let Ok(n) = from.read(&mut buffer) {
            if n == 0 || to.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}
