//! Uppercases prompt and response text, refuses anything containing
//! "forbidden" (403), and counts streamed chunks to show that state lives
//! exactly one instance (one request).

use std::sync::atomic::{AtomicU32, Ordering};

use bulkhead::plugin::host::{Level, log};
use bulkhead::plugin::types::Prompt;

wit_bindgen::generate!({ path: "../../../../guest-sdk/wit", world: "plugin" });

static CHUNKS: AtomicU32 = AtomicU32::new(0);

fn forbidden() -> Rejection {
    Rejection {
        status: 403,
        message: "the word \"forbidden\" is forbidden".to_string(),
    }
}

fn check(text: &str) -> Result<String, Rejection> {
    if text.contains("forbidden") {
        log(Level::Warn, "refused a forbidden word");
        return Err(forbidden());
    }
    Ok(text.to_uppercase())
}

struct Rewrite;

impl Guest for Rewrite {
    fn on_request(mut req: Request) -> Result<Request, Rejection> {
        req.prompt = match req.prompt {
            Prompt::Text(text) => Prompt::Text(check(&text)?),
            Prompt::Chat(mut messages) => {
                for message in &mut messages {
                    message.content = check(&message.content)?;
                }
                Prompt::Chat(messages)
            }
            tokens @ Prompt::Tokens(_) => tokens,
        };
        req.metadata
            .push(("rewritten-by".to_string(), "rewrite".to_string()));
        Ok(req)
    }

    fn on_response(mut resp: Response) -> Result<Response, Rejection> {
        resp.text = check(&resp.text)?;
        Ok(resp)
    }

    fn on_chunk(text: String) -> Result<String, Rejection> {
        CHUNKS.fetch_add(1, Ordering::Relaxed);
        check(&text)
    }

    fn on_stream_end() -> Result<String, Rejection> {
        Ok(format!("[{} chunks]", CHUNKS.load(Ordering::Relaxed)))
    }
}

export!(Rewrite);
