//! Shows a client what the model was asked: `on-request` remembers the
//! request as the chain left it (put it last in `on_request`), and
//! `on-response` / the stream hooks answer with that instead of the model's
//! text. Proves request rewrites end to end, and that one instance serves
//! both hooks of a request.

use std::cell::RefCell;

use bulkhead::plugin::types::Prompt;

wit_bindgen::generate!({ path: "../../../../guest-sdk/wit", world: "plugin" });

thread_local! {
    static SEEN: RefCell<String> = const { RefCell::new(String::new()) };
}

fn describe(req: &Request) -> String {
    let prompt = match &req.prompt {
        Prompt::Chat(messages) => messages
            .iter()
            .map(|m| format!("{}: {}", m.role, m.content))
            .collect::<Vec<_>>()
            .join("\n"),
        Prompt::Text(text) => text.clone(),
        Prompt::Tokens(ids) => format!("{ids:?}"),
    };
    let metadata = req
        .metadata
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "model={} max_tokens={:?}\n{prompt}\n[{metadata}]",
        req.model, req.sampling.max_tokens
    )
}

struct Mirror;

impl Guest for Mirror {
    fn on_request(req: Request) -> Result<Request, Rejection> {
        SEEN.with(|seen| *seen.borrow_mut() = describe(&req));
        Ok(req)
    }

    fn on_response(mut resp: Response) -> Result<Response, Rejection> {
        resp.text = SEEN.with(|seen| seen.borrow().clone());
        Ok(resp)
    }

    fn on_chunk(_text: String) -> Result<String, Rejection> {
        Ok(String::new())
    }

    fn on_stream_end() -> Result<String, Rejection> {
        Ok(SEEN.with(|seen| seen.borrow().clone()))
    }
}

export!(Mirror);
