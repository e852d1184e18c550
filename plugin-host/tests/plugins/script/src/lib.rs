//! Replaces a response with scripted text, so tests can drive the plugins
//! after it with exactly the pieces they need whatever the model says:
//! config `script` is split on `|`; each streamed delta is replaced by the
//! next piece (or nothing once the script ran out) and the end of the
//! stream sends the pieces left over. A whole response becomes the script
//! joined.

use std::cell::RefCell;

use bulkhead::plugin::host::config;

wit_bindgen::generate!({ path: "../../../../guest-sdk/wit", world: "plugin" });

thread_local! {
    /// Pieces not sent yet, the next one last.
    static LEFT: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

fn pieces() -> Vec<String> {
    config("script")
        .unwrap_or_default()
        .split('|')
        .map(str::to_string)
        .collect()
}

/// Runs `f` on the pieces not sent yet (last piece first).
fn with_left<T>(f: impl FnOnce(&mut Vec<String>) -> T) -> T {
    LEFT.with(|left| {
        let mut left = left.borrow_mut();
        f(left.get_or_insert_with(|| {
            let mut all = pieces();
            all.reverse();
            all
        }))
    })
}

struct Script;

impl Guest for Script {
    fn on_request(req: Request) -> Result<Request, Rejection> {
        Ok(req)
    }

    fn on_response(mut resp: Response) -> Result<Response, Rejection> {
        resp.text = pieces().concat();
        Ok(resp)
    }

    fn on_chunk(_text: String) -> Result<String, Rejection> {
        Ok(with_left(Vec::pop).unwrap_or_default())
    }

    fn on_stream_end() -> Result<String, Rejection> {
        Ok(with_left(|left| {
            let rest: String = left.iter().rev().map(String::as_str).collect();
            left.clear();
            rest
        }))
    }
}

export!(Script);
