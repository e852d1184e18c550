//! A plugin that misbehaves on request: `on-request` reads the prompt text
//! and does what it names. Each behaviour must fail only its own call, with
//! the error that names the limit it hit.

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, Ordering};

use bulkhead::plugin::host::{Level, config, config_entries, log};
use bulkhead::plugin::types::Prompt;

wit_bindgen::generate!({ path: "../../../../guest-sdk/wit", world: "plugin" });

/// Calls this instance has served: must be 1 on every fresh instance.
static CALLS: AtomicU32 = AtomicU32::new(0);

/// Recurses until the wasm stack runs out (`depth` never reaches the end).
/// Only scalars per frame: they live on the wasm stack, not the shadow
/// stack in linear memory, so the engine's stack limit is what stops it.
/// The result feeds back non-associatively so the call cannot become a loop.
#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if depth == u64::MAX {
        return 0;
    }
    let next = recurse(depth + 1);
    next ^ depth.rotate_left((next & 63) as u32)
}

struct Hostile;

impl Guest for Hostile {
    fn on_request(mut req: Request) -> Result<Request, Rejection> {
        let calls = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
        let Prompt::Text(command) = &req.prompt else {
            return Ok(req);
        };
        match command.as_str() {
            "loop" => {
                let mut n = 0u64;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            "grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "recurse" => {
                black_box(recurse(black_box(0)));
            }
            "huge" => req.prompt = Prompt::Text("x".repeat(black_box(16 << 20))),
            "huge-rejection" => {
                return Err(Rejection {
                    status: 400,
                    message: "x".repeat(black_box(16 << 20)),
                });
            }
            "huge-metadata" => {
                for i in 0..100_000 {
                    req.metadata.push((format!("key-{i}"), "v".repeat(100)));
                }
            }
            "panic" => panic!("the hostile plugin panics on request"),
            "reject-500" => {
                return Err(Rejection {
                    status: 500,
                    message: "not a 4xx".to_string(),
                });
            }
            "log-flood" => {
                let long = "y".repeat(10_000);
                for _ in 0..10_000 {
                    log(Level::Info, &long);
                }
            }
            "print-flood" => {
                let long = "z".repeat(10_000);
                for _ in 0..10_000 {
                    println!("{long}");
                    eprintln!("{long}");
                }
            }
            "config" => {
                let greeting = config("greeting").unwrap_or_else(|| "<none>".to_string());
                req.metadata.push(("greeting".to_string(), greeting));
                let missing = config("missing").is_none();
                req.metadata
                    .push(("missing-is-none".to_string(), missing.to_string()));
                for (key, value) in config_entries() {
                    req.metadata.push((format!("entry:{key}"), value));
                }
            }
            _ => {}
        }
        req.metadata.push(("calls".to_string(), calls.to_string()));
        Ok(req)
    }

    fn on_response(resp: Response) -> Result<Response, Rejection> {
        Ok(resp)
    }

    fn on_chunk(text: String) -> Result<String, Rejection> {
        if text == "loop" {
            let mut n = 0u64;
            loop {
                n = black_box(n.wrapping_add(1));
            }
        }
        Ok(text)
    }

    fn on_stream_end() -> Result<String, Rejection> {
        Ok(String::new())
    }
}

export!(Hostile);
