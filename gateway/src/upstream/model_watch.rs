//! Watches the gpu-host's models so the gateway learns, within one poll,
//! that the host's weight scrub took a model out of service: a metric, an
//! error log and an audit entry, without any request having to hit it.
//! (Requests never wait on this: the host itself refuses a model out of
//! service with FAILED_PRECONDITION, which becomes 503 `model_unavailable`.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bulkhead_protocol::v1::ModelInfo;
use tokio::task::JoinHandle;

use super::{Upstream, UpstreamState};
use crate::audit::{Actor, Audit, Event};
use crate::metrics::{Metrics, ModelLabels};

/// How often the host's models are listed: a quarantine is seen (and
/// audited) at most this late; one small RPC per second costs nothing.
pub const MODEL_POLL: Duration = Duration::from_secs(1);

/// What the watcher last saw of one loaded model.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    digest: String,
    serving: bool,
}

/// The models' last known states; turns each listing into the events worth
/// recording.
#[derive(Debug, Default)]
pub(crate) struct ModelStates(BTreeMap<String, Seen>);

/// A model newly found out of service.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Quarantined {
    pub model: String,
    pub digest: String,
    pub reason: String,
}

impl ModelStates {
    /// Updates the metrics from `models` and returns the models that went
    /// out of service since the last listing (each loaded instance once: a
    /// model reloaded after a restart serves again and is watched anew).
    pub(crate) fn observe(&mut self, models: &[ModelInfo], metrics: &Metrics) -> Vec<Quarantined> {
        let mut found = Vec::new();
        let mut next = BTreeMap::new();
        for m in models {
            let labels = ModelLabels {
                model: m.name.clone(),
            };
            metrics
                .model_serving
                .get_or_create(&labels)
                .set(i64::from(m.serving));
            metrics
                .model_weights_verified_at
                .get_or_create(&labels)
                .set(i64::try_from(m.weights_verified_at_unix_ms / 1000).unwrap_or(i64::MAX));
            metrics
                .model_scrubbed_bytes
                .get_or_create(&labels)
                .set(i64::try_from(m.scrubbed_bytes).unwrap_or(i64::MAX));
            metrics
                .model_scrub_floor_bytes
                .get_or_create(&labels)
                .set(i64::try_from(m.scrub_floor_bytes).unwrap_or(i64::MAX));
            let was_serving = match self.0.get(&m.name) {
                Some(seen) if seen.digest == m.digest => seen.serving,
                // New, or reloaded with other weights: as if it had served.
                _ => true,
            };
            if was_serving && !m.serving {
                metrics.model_weight_mismatches.get_or_create(&labels).inc();
                found.push(Quarantined {
                    model: m.name.clone(),
                    digest: m.digest.clone(),
                    reason: m.unavailable_reason.clone(),
                });
            }
            next.insert(
                m.name.clone(),
                Seen {
                    digest: m.digest.clone(),
                    serving: m.serving,
                },
            );
        }
        for gone in self.0.keys().filter(|name| !next.contains_key(*name)) {
            let labels = ModelLabels {
                model: gone.clone(),
            };
            metrics.model_serving.remove(&labels);
            metrics.model_weights_verified_at.remove(&labels);
            metrics.model_scrubbed_bytes.remove(&labels);
            metrics.model_scrub_floor_bytes.remove(&labels);
        }
        self.0 = next;
        found
    }
}

/// Polls the host's models every [`MODEL_POLL`] until the task is aborted.
/// Without `metrics` (one of several hosts: the model gauges have no host
/// label) only quarantines are logged and recorded.
pub fn watch_models(
    upstream: Upstream,
    metrics: Option<Arc<Metrics>>,
    audit: Audit,
) -> JoinHandle<()> {
    let metrics = metrics.unwrap_or_default();
    tokio::spawn(async move {
        let mut states = ModelStates::default();
        let mut tick = tokio::time::interval(MODEL_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            if upstream.state() != UpstreamState::Ready {
                continue;
            }
            let Ok(models) = upstream.list_models().await else {
                continue; // restarting or unreachable: the next poll tries again
            };
            for q in states.observe(&models, &metrics) {
                tracing::error!(
                    model = %q.model,
                    digest = %q.digest,
                    reason = %q.reason,
                    "the gpu-host took a model out of service: its resident weights changed"
                );
                let event = Event::ModelQuarantine {
                    model: q.model,
                    digest: q.digest,
                    reason: q.reason,
                };
                if let Err(e) = audit.record_async(Actor::Gateway, event).await {
                    tracing::error!("could not audit the quarantine: {e}");
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, digest: &str, serving: bool) -> ModelInfo {
        ModelInfo {
            name: name.into(),
            digest: digest.into(),
            serving,
            unavailable_reason: if serving {
                String::new()
            } else {
                format!("{name} chunk 1")
            },
            weights_verified_at_unix_ms: 5_000,
            scrubbed_bytes: 42,
            scrub_floor_bytes: 7,
            ..Default::default()
        }
    }

    fn gauge(
        family: &prometheus_client::metrics::family::Family<
            ModelLabels,
            prometheus_client::metrics::gauge::Gauge,
        >,
        model: &str,
    ) -> i64 {
        family
            .get_or_create(&ModelLabels {
                model: model.into(),
            })
            .get()
    }

    #[test]
    fn each_loaded_instance_is_reported_once_when_it_goes_out_of_service() {
        let metrics = Metrics::new();
        let mut states = ModelStates::default();
        assert!(
            states
                .observe(&[info("a", "d1", true), info("b", "d2", true)], &metrics)
                .is_empty()
        );
        assert_eq!(gauge(&metrics.model_serving, "a"), 1);
        assert_eq!(gauge(&metrics.model_weights_verified_at, "a"), 5);
        assert_eq!(gauge(&metrics.model_scrubbed_bytes, "a"), 42);
        assert_eq!(gauge(&metrics.model_scrub_floor_bytes, "a"), 7);

        let found = states.observe(&[info("a", "d1", false), info("b", "d2", true)], &metrics);
        assert_eq!(
            found,
            [Quarantined {
                model: "a".into(),
                digest: "d1".into(),
                reason: "a chunk 1".into(),
            }]
        );
        assert_eq!(gauge(&metrics.model_serving, "a"), 0);
        // Still out of service: not reported again.
        assert!(
            states
                .observe(&[info("a", "d1", false)], &metrics)
                .is_empty()
        );
        // Reloaded (a restart) and serving, then corrupted again: reported again.
        assert!(
            states
                .observe(&[info("a", "d1", true)], &metrics)
                .is_empty()
        );
        assert_eq!(states.observe(&[info("a", "d1", false)], &metrics).len(), 1);
        // Already out of service when first seen (a gateway restart): reported.
        let mut fresh = ModelStates::default();
        assert_eq!(fresh.observe(&[info("c", "d3", false)], &metrics).len(), 1);
        let text = metrics.render();
        assert!(
            text.contains("bulkhead_model_weight_mismatches_total{model=\"a\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("bulkhead_model_scrub_floor_bytes{model=\"a\"} 7"),
            "{text}"
        );
        // A model no longer listed drops out of the gauges.
        states.observe(&[], &metrics);
        let text = metrics.render();
        assert!(
            !text.contains("bulkhead_model_serving{model=\"a\"}"),
            "{text}"
        );
        assert!(
            !text.contains("bulkhead_model_scrub_floor_bytes{model=\"a\"}"),
            "{text}"
        );
    }
}
