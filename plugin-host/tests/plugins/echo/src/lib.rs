//! The no-op plugin: every hook returns its input unchanged. Its imports are
//! the least a Rust `wasm32-wasip2` plugin has.

wit_bindgen::generate!({ path: "../../../../guest-sdk/wit", world: "plugin" });

struct Echo;

impl Guest for Echo {
    fn on_request(req: Request) -> Result<Request, Rejection> {
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

export!(Echo);
