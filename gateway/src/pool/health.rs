//! Each host's health checker: a `Health` call every [`HEALTH_EVERY`]
//! while the host is in rotation, after each backoff while it is out. An
//! answer records the host's load and puts it back; a failure (or no
//! answer within [`HEALTH_TIMEOUT`]) takes it out, or doubles its backoff
//! up to [`EJECT_MOST`]. A host that answers with fewer models than it was
//! given restarted empty: it is passed over for them until they are
//! loaded again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Host, Load};
use crate::metrics::Metrics;

/// Between checks of a host in rotation.
pub const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// The longest a check waits for its answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);
/// The first wait before an ejected host is checked again.
pub const EJECT_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between checks of an ejected host.
pub const EJECT_MOST: Duration = Duration::from_secs(30);

/// Checks `host` until the task is aborted.
pub(super) async fn watch(host: Host, metrics: Arc<Metrics>) {
    loop {
        let wait = host
            .back_at()
            .saturating_duration_since(Instant::now())
            .max(if host.ejected() {
                Duration::ZERO
            } else {
                HEALTH_EVERY
            });
        tokio::time::sleep(wait).await;
        if !host.state.sync.process_up() {
            // A local child (re)starting: its supervisor says when it is
            // back, and requests wait for that; nothing to check yet.
            continue;
        }
        let answer = tokio::time::timeout(HEALTH_TIMEOUT, host.state.sync.health()).await;
        match answer {
            Ok(Ok(health)) => {
                let sync = &host.state.sync;
                if usize::try_from(health.models).is_ok_and(|n| n < sync.models().len()) {
                    tracing::warn!(
                        host = %host.name(),
                        "the gpu-host holds fewer models than it was given (it restarted); \
                         loading them again before it takes their requests"
                    );
                    sync.lost_models();
                }
                host.state.load.store(Arc::new(Some(Load {
                    kv_bytes: health.kv_bytes,
                    kv_bytes_used: health.kv_bytes_used,
                    queued: health.queued,
                    running: health.running,
                })));
                host.recovered(&metrics);
            }
            Ok(Err(e)) => host.failed_check(&e.to_string(), &metrics),
            Err(_) => host.failed_check(
                &format!(
                    "no answer to a health check within {} s",
                    HEALTH_TIMEOUT.as_secs()
                ),
                &metrics,
            ),
        }
    }
}

impl Host {
    /// A health check answered: back in rotation, the backoff reset.
    pub(super) fn recovered(&self, metrics: &Metrics) {
        let mut health = self.health();
        health.backoff = EJECT_FIRST;
        let Some((since, _)) = health.ejected.take() else {
            return;
        };
        let draining = health.draining;
        drop(health);
        if !draining {
            metrics.gpu_host_up.get_or_create(&self.state.labels).set(1);
        }
        tracing::info!(
            host = %self.name(),
            out_for_ms = since.elapsed().as_millis(),
            "gpu-host back in rotation"
        );
    }

    /// A health check failed: out of rotation, or out for twice as long.
    pub(super) fn failed_check(&self, why: &str, metrics: &Metrics) {
        let mut health = self.health();
        if let Some((since, _)) = health.ejected {
            health.backoff = (health.backoff * 2).min(EJECT_MOST);
            health.ejected = Some((since, Instant::now() + health.backoff));
            health.last_error = Some(why.to_string());
            return;
        }
        drop(health);
        self.eject(why, metrics);
    }
}
