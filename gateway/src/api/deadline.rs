//! A deadline for reading a request's body: the whole body must arrive
//! within `[connections] body_read_timeout_ms` of its head, however it is
//! paced. A per-read idle timeout would not do: a client sending one byte
//! a second never idles, and holds its connection (and what it reserved)
//! for as long as it likes. Past the deadline the body ends with
//! [`BodyDeadline`], which the handlers answer with 408.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::App;

/// The body was not all received within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyDeadline(pub Duration);

impl BodyDeadline {
    /// Whether `error` (or what caused it) is a body deadline.
    pub fn caused<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyDeadline> {
        let mut at: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = at {
            if let Some(deadline) = e.downcast_ref::<BodyDeadline>() {
                return Some(deadline);
            }
            at = e.source();
        }
        None
    }
}

/// A body that fails once its deadline passes.
struct DeadlineBody {
    inner: Body,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        // A frame ready now is taken even at the deadline; only waiting
        // past it fails.
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyDeadline(self.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware: gives the request's body the deadline of the policy in
/// force. A body already complete (none, or the end seen) is left alone.
pub async fn body_deadline(State(app): State<App>, request: Request, next: Next) -> Response {
    let timeout = app
        .snapshot
        .load()
        .policy
        .gateway
        .connections
        .body_read_timeout;
    let (parts, body) = request.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let body = Body::new(DeadlineBody {
        inner: body,
        timeout,
        sleep: Box::pin(tokio::time::sleep_until(Instant::now() + timeout)),
    });
    next.run(Request::from_parts(parts, body)).await
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tokio_stream::StreamExt;
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;

    /// A body fed through a channel, as a slow client would send it.
    fn trickle() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(8);
        let chunks = ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
        (tx, Body::from_stream(chunks))
    }

    #[tokio::test]
    async fn a_body_trickled_past_its_deadline_fails_however_it_is_paced() {
        let (tx, body) = trickle();
        let timeout = Duration::from_millis(200);
        let body = DeadlineBody {
            inner: body,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        };
        // A byte every 20 ms: never idle for long, yet never done.
        tokio::spawn(async move {
            while tx.send(Bytes::from_static(b"x")).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let error = body.collect().await.unwrap_err();
        let error: &(dyn std::error::Error + 'static) = &error;
        assert_eq!(BodyDeadline::caused(error).map(|d| d.0), Some(timeout));
    }

    #[tokio::test]
    async fn a_body_that_arrives_in_time_is_read_whole() {
        let (tx, body) = trickle();
        let timeout = Duration::from_secs(30);
        let body = DeadlineBody {
            inner: body,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        };
        for _ in 0..3 {
            tx.send(Bytes::from_static(b"ab")).await.unwrap();
        }
        drop(tx);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"ababab");
    }
}
