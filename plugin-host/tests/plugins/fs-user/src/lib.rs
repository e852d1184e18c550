//! Reads a file with std: the component then imports `wasi:filesystem`,
//! which plugins are not offered, so the upload must be refused naming it.

wit_bindgen::generate!({ path: "../../../../guest-sdk/wit", world: "plugin" });

struct FsUser;

impl Guest for FsUser {
    fn on_request(mut req: Request) -> Result<Request, Rejection> {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        req.metadata.push(("passwd".to_string(), passwd));
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

export!(FsUser);
