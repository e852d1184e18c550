//! The `Plugin` trait and `export_plugin!`, which turns an implementation
//! into the component's exports.

use std::cell::RefCell;

use crate::{Rejection, Request, Response};

/// A plugin: implement the hooks you need, the others pass everything
/// through unchanged.
///
/// The gateway runs one instance of the component per request, so a value of
/// your type lives for one request: it is made with [`Default`] at the
/// request's first hook call and dropped after its last one (`on_response`,
/// `on_stream_end`, or any hook that rejects). Fields are the place for state
/// a stream needs across [`Plugin::on_chunk`] calls.
pub trait Plugin: Default + 'static {
    /// Rewrites (return it changed) or rejects the request before it reaches
    /// the model. Default: unchanged.
    fn on_request(&mut self, req: Request) -> Result<Request, Rejection> {
        Ok(req)
    }

    /// Rewrites or rejects a complete (non-streamed) response. Default:
    /// unchanged.
    fn on_response(&mut self, resp: Response) -> Result<Response, Rejection> {
        Ok(resp)
    }

    /// One streamed delta of text: returns the text to send now. Return less
    /// (even nothing) to hold text back and send it from a later call or from
    /// [`Plugin::on_stream_end`]. Default: passes `text` through.
    fn on_chunk(&mut self, text: String) -> Result<String, Rejection> {
        Ok(text)
    }

    /// The stream ended: returns whatever was held back. Default: nothing.
    fn on_stream_end(&mut self) -> Result<String, Rejection> {
        Ok(String::new())
    }
}

/// Exports a [`Plugin`] implementation as the component's hooks. Use it once,
/// in the plugin crate's `lib.rs`:
///
/// ```no_run
/// use bulkhead_guest::{Plugin, export_plugin};
///
/// #[derive(Default)]
/// struct Passthrough;
///
/// impl Plugin for Passthrough {}
///
/// export_plugin!(Passthrough);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: () = {
            ::std::thread_local! {
                static BULKHEAD_PLUGIN: $crate::__private::Slot<$plugin> =
                    const { $crate::__private::Slot::new() };
            }

            struct BulkheadExports;

            impl $crate::__private::Guest for BulkheadExports {
                fn on_request(
                    req: $crate::Request,
                ) -> ::core::result::Result<$crate::Request, $crate::Rejection> {
                    BULKHEAD_PLUGIN.with(|slot| slot.on_request(req))
                }

                fn on_response(
                    resp: $crate::Response,
                ) -> ::core::result::Result<$crate::Response, $crate::Rejection> {
                    BULKHEAD_PLUGIN.with(|slot| slot.on_response(resp))
                }

                fn on_chunk(
                    text: ::std::string::String,
                ) -> ::core::result::Result<::std::string::String, $crate::Rejection> {
                    BULKHEAD_PLUGIN.with(|slot| slot.on_chunk(text))
                }

                fn on_stream_end()
                -> ::core::result::Result<::std::string::String, $crate::Rejection> {
                    BULKHEAD_PLUGIN.with(|slot| slot.on_stream_end())
                }
            }

    $crate::__export_plugin_impl!(BulkheadExports with_types_in $crate::bindings);
        };
    };
}

/// Whether a hook is the last one of its request when it succeeds.
#[derive(Clone, Copy, Debug)]
enum HookEnds {
    NotYet,
    TheRequest,
}

/// Holds the plugin value of the request in flight (see [`Plugin`]).
#[doc(hidden)]
#[derive(Debug)]
pub struct Slot<P>(RefCell<Option<P>>);

impl<P> Default for Slot<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P> Slot<P> {
    /// An empty slot: the value is made at the first hook call.
    pub const fn new() -> Self {
        Self(RefCell::new(None))
    }
}

impl<P: Plugin> Slot<P> {
    /// Runs `on_request`.
    pub fn on_request(&self, req: Request) -> Result<Request, Rejection> {
        self.run(HookEnds::NotYet, |plugin| plugin.on_request(req))
    }

    /// Runs `on_response`.
    pub fn on_response(&self, resp: Response) -> Result<Response, Rejection> {
        self.run(HookEnds::TheRequest, |plugin| plugin.on_response(resp))
    }

    /// Runs `on_chunk`.
    pub fn on_chunk(&self, text: String) -> Result<String, Rejection> {
        self.run(HookEnds::NotYet, |plugin| plugin.on_chunk(text))
    }

    /// Runs `on_stream_end`.
    pub fn on_stream_end(&self) -> Result<String, Rejection> {
        self.run(HookEnds::TheRequest, |plugin| plugin.on_stream_end())
    }

    fn run<T>(
        &self,
        ends: HookEnds,
        hook: impl FnOnce(&mut P) -> Result<T, Rejection>,
    ) -> Result<T, Rejection> {
        let mut slot = self.0.borrow_mut();
        let result = hook(slot.get_or_insert_with(P::default));
        // The instance serves exactly one request; dropping the value here
        // also keeps one request's state from reaching another should an
        // instance ever be reused.
        if matches!(ends, HookEnds::TheRequest) || result.is_err() {
            *slot = None;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Prompt;

    /// Counts chunks and reports the count at the end of the stream.
    #[derive(Default)]
    struct Counter {
        chunks: usize,
    }

    impl Plugin for Counter {
        fn on_chunk(&mut self, text: String) -> Result<String, Rejection> {
            self.chunks += 1;
            if text == "bad" {
                return Err(Rejection::bad_request("bad chunk"));
            }
            Ok(String::new())
        }

        fn on_stream_end(&mut self) -> Result<String, Rejection> {
            Ok(self.chunks.to_string())
        }
    }

    #[derive(Default)]
    struct Defaults;

    impl Plugin for Defaults {}

    #[test]
    fn default_hooks_pass_everything_through() {
        let mut plugin = Defaults;
        let req = Request::new("m", Prompt::Text("hi".into()));
        assert_eq!(plugin.on_request(req.clone()), Ok(req));
        let resp = Response::new("m", "out");
        assert_eq!(plugin.on_response(resp.clone()), Ok(resp));
        assert_eq!(plugin.on_chunk("a".into()), Ok("a".into()));
        assert_eq!(plugin.on_stream_end(), Ok(String::new()));
    }

    #[test]
    fn state_lives_for_one_stream() {
        let slot = Slot::<Counter>::new();
        slot.on_chunk("a".into()).unwrap();
        slot.on_chunk("b".into()).unwrap();
        assert_eq!(slot.on_stream_end(), Ok("2".into()));
        // A new stream starts from a fresh value.
        slot.on_chunk("c".into()).unwrap();
        assert_eq!(slot.on_stream_end(), Ok("1".into()));
    }

    #[test]
    fn a_rejection_drops_the_state() {
        let slot = Slot::<Counter>::new();
        slot.on_chunk("a".into()).unwrap();
        assert!(slot.on_chunk("bad".into()).is_err());
        assert_eq!(slot.on_stream_end(), Ok("0".into()));
    }
}
