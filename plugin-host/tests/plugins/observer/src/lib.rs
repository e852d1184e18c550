//! Uses what Rust's std reaches through WASI without a filesystem —
//! environment, arguments, clocks, randomness (via `HashMap`'s seed), stdio — and
//! reports what it saw in the request metadata. The host must show it
//! nothing from outside, the same on every call.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

wit_bindgen::generate!({ path: "../../../../guest-sdk/wit", world: "plugin" });

struct Observer;

impl Guest for Observer {
    fn on_request(mut req: Request) -> Result<Request, Rejection> {
        let seen = |key: &str, value: String| (key.to_string(), value);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos().to_string())
            .unwrap_or_else(|e| format!("before epoch: {e}"));
        let started = Instant::now();
        let hash = RandomState::new().hash_one("bulkhead");
        let mut map = HashMap::new();
        map.insert("k", 1);
        println!("observer: to stdout");
        eprintln!("observer: to stderr");
        req.metadata.extend([
            seen("env", std::env::vars().count().to_string()),
            seen("args", std::env::args().count().to_string()),
            seen("wall-ns", wall),
            seen("monotonic-ns", started.elapsed().as_nanos().to_string()),
            seen("hash", hash.to_string()),
        ]);
        Ok(req)
    }

    fn on_response(resp: Response) -> Result<Response, Rejection> {
        Ok(resp)
    }

    fn on_chunk(text: String) -> Result<String, Rejection> {
        Ok(text)
    }

    fn on_stream_end() -> Result<String, Rejection> {
        Ok(String::new())
    }
}

export!(Observer);
