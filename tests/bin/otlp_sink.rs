//! An OTLP/gRPC trace receiver that counts the spans it is sent and keeps
//! none: the collector of `tests/bench/gateway_overhead` (tracing on).
//!
//!     otlp-sink [ADDR]      default 127.0.0.1:0
//!
//! Prints `listening on http://ADDR` on stdout, then `spans N` on stderr
//! every second until it is killed.

use std::io::Write;
use std::time::Duration;

use bulkhead_tests::otlp::Receiver;

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let receiver = Receiver::grpc_on(&addr, true);
    println!("listening on {}", receiver.endpoint());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        eprintln!("spans {}", receiver.count());
    }
}
