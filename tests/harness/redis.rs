//! The test Redis (127.0.0.1:6379, `BULKHEAD_TEST_REDIS` overrides): a key
//! prefix per test, deleted when done.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{SystemTime, UNIX_EPOCH};

pub use super::proxy::Proxy;

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
