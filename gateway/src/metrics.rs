//! Prometheus metrics served at `GET /metrics`.
//!
//! Tenant labels come only from verified tokens (requests that fail auth are
//! counted under `tenant=""`), so label cardinality is bounded by the policy.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod gen_ai;

pub use gen_ai::{GenAiCall, GenAiMetrics};

/// The target of every span the gateway exports (`bulkhead_telemetry`
/// exports the spans whose target starts with `bulkhead`).
pub const TRACE_TARGET: &str = "bulkhead::trace";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub tenant: String,
    pub endpoint: &'static str,
    pub status: u16,
}

/// `bulkhead_connections_refused_total`: a connection closed at accept
/// because a cap (`[connections]`) was reached.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionRefusalLabels {
    /// `public` or `admin`.
    pub listener: &'static str,
    /// `max_connections` or `max_connections_per_ip`.
    pub reason: &'static str,
}

/// `bulkhead_admin_refusals_total`: an operator route refused a call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdminRefusalLabels {
    /// The error `code` (`missing_authorization`, `unknown_issuer`,
    /// `insufficient_scope`, …).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub tenant: String,
    /// The error `code` (e.g. `rate_limit_requests`, `token_expired`).
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub tenant: String,
    /// `prompt` or `completion`.
    pub kind: &'static str,
}

/// `bulkhead_trace_spans_total`: what became of the spans this process
/// finished.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SpanOutcomeLabels {
    /// `exported`, `dropped` (the export queue was full) or `failed` (the
    /// collector did not take them).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCallLabels {
    pub tenant: String,
    pub plugin: String,
    pub hook: &'static str,
    /// `ok`, `rejected`, or the failure's code (`plugin_timeout`, …).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    pub tenant: String,
    pub hook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `failed`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginUploadLabels {
    pub tenant: String,
    /// `created`, `replaced`, `unchanged`, or the error `code` that refused
    /// it (`plugin_forbidden_import`, `plugin_too_large`, …).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
}

/// One gpu-host by its name in `gateway.toml` (`local` for the child).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PartitionLabels {
    /// `shared` or `dedicated:TENANT`.
    pub partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PartitionTenantLabels {
    pub partition: String,
    pub tenant: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn plugin_histogram() -> Histogram {
    // 10 µs … ~0.65 s: a hook takes microseconds; its deadline is at most 1 s.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 17))
}

fn gate_histogram() -> Histogram {
    // 1 µs … ~4 s: no wait at all is the common case; a wait is whole
    // hook runs of other requests, up to their deadlines.
    Histogram::new(exponential_buckets(0.000_001, 4.0, 12))
}

fn latency_histogram() -> Histogram {
    // 1 ms … ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric the gateway exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub rejections: Family<RejectionLabels, Counter>,
    pub tokens: Family<TokenLabels, Counter>,
    pub latency: Histograms<TenantLabels>,
    pub time_to_first_token: Histograms<TenantLabels>,
    /// Held through [`OpenStream`] guards.
    upstream_streams_open: Family<TenantLabels, Gauge>,
    pub policy_reloads: Family<ResultLabels, Counter>,
    pub policy_reloads_unrecorded: Counter,
    pub audit_append_failures: Counter,
    pub plugin_calls: Family<PluginCallLabels, Counter>,
    pub plugin_duration: Histograms<HookLabels>,
    pub plugin_gate_wait: Histograms<TenantLabels>,
    pub upstream_starts: Counter,
    pub upstream_ready: Gauge,
    pub plugin_uploads: Family<PluginUploadLabels, Counter>,
    pub model_serving: Family<ModelLabels, Gauge>,
    pub model_weights_verified_at: Family<ModelLabels, Gauge>,
    pub model_scrubbed_bytes: Family<ModelLabels, Gauge>,
    pub model_scrub_floor_bytes: Family<ModelLabels, Gauge>,
    pub model_weight_mismatches: Family<ModelLabels, Counter>,
    pub partition_kv_blocks: Family<PartitionTenantLabels, Gauge>,
    pub partition_kv_refusals: Family<PartitionTenantLabels, Counter>,
    pub partition_running: Family<PartitionLabels, Gauge>,
    pub partition_queued: Family<PartitionLabels, Gauge>,
    pub partition_memory_bytes: Family<PartitionLabels, Gauge>,
    pub partition_memory_used_bytes: Family<PartitionLabels, Gauge>,
    pub partition_preemptions: Family<PartitionLabels, Counter>,
    pub partition_device_errors: Family<PartitionLabels, Counter>,
    pub lane_connections: Family<TenantLabels, Counter>,
    pub admin_refusals: Family<AdminRefusalLabels, Counter>,
    pub connections_refused: Family<ConnectionRefusalLabels, Counter>,
    pub lane_foreign_requests: Family<TenantLabels, Counter>,
    pub audit_entries: Gauge,
    pub audit_bytes: Gauge,
    pub audit_failed: Gauge,
    /// `[limits] store` calls that failed or timed out.
    pub limit_store_errors: Counter,
    /// 1 while the shared limit store answers (absent without one).
    pub limit_store_up: Gauge,
    /// Admissions decided by this replica's own limiters because the
    /// shared store did not answer.
    pub limit_store_fallbacks: Family<TenantLabels, Counter>,
    /// 1 while a gpu-host takes new requests (not ejected, not draining).
    pub gpu_host_up: Family<HostLabels, Gauge>,
    /// Generations a gpu-host is running for this replica.
    pub gpu_host_outstanding: Family<HostLabels, Gauge>,
    /// Times a gpu-host was taken out of rotation after a failure.
    pub gpu_host_ejections: Family<HostLabels, Counter>,
    /// Generations sent to a second host after the first failed before
    /// starting.
    pub gpu_host_retries: Counter,
    /// Generations each gpu-host started for this gateway.
    pub gpu_host_generations: Family<HostLabels, Counter>,
    /// Exported, dropped and failed spans (present when exporting).
    trace_spans: Family<SpanOutcomeLabels, Counter>,
    /// The OpenTelemetry GenAI metrics (OTLP; no-ops without export).
    pub gen_ai: GenAiMetrics,
    span_counts: std::sync::OnceLock<std::sync::Arc<bulkhead_telemetry::SpanCounts>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("bulkhead");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Inference requests by tenant, endpoint and HTTP status",
            requests.clone(),
        );
        let rejections = Family::<RejectionLabels, Counter>::default();
        registry.register(
            "rejections",
            "Requests refused before or during generation, by reason",
            rejections.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "tokens",
            "Prompt and completion tokens by tenant",
            tokens.clone(),
        );
        let latency: Histograms<TenantLabels> = Family::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from request to the last byte of the response",
            latency.clone(),
        );
        let time_to_first_token: Histograms<TenantLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "time_to_first_token_seconds",
            "Time from request to the first generated text",
            time_to_first_token.clone(),
        );
        let upstream_streams_open = Family::<TenantLabels, Gauge>::default();
        registry.register(
            "upstream_streams_open",
            "Generations whose gpu-host stream is open (started, not yet finished, failed or dropped by the client)",
            upstream_streams_open.clone(),
        );
        let policy_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "policy_reloads",
            "Policy reloads; `failed` ones left the previous policy serving",
            policy_reloads.clone(),
        );
        let policy_reloads_unrecorded = Counter::default();
        registry.register(
            "policy_reloads_unrecorded",
            "Reloads applied although the audit log could not record them (only reloads that restrict tenants are)",
            policy_reloads_unrecorded.clone(),
        );
        let audit_append_failures = Counter::default();
        registry.register(
            "audit_append_failures",
            "Audit appends that failed (each write or fsync error; the log takes entries again once it could cut its file back)",
            audit_append_failures.clone(),
        );
        let plugin_calls = Family::<PluginCallLabels, Counter>::default();
        registry.register(
            "plugin_calls",
            "Plugin hook calls by tenant, plugin, hook and result (ok, rejected, or the failure)",
            plugin_calls.clone(),
        );
        let plugin_duration: Histograms<HookLabels> =
            Family::new_with_constructor(plugin_histogram);
        registry.register(
            "plugin_call_duration_seconds",
            "Time one plugin hook call took (instantiation included), by tenant and hook",
            plugin_duration.clone(),
        );
        let plugin_gate_wait: Histograms<TenantLabels> =
            Family::new_with_constructor(gate_histogram);
        registry.register(
            "plugin_gate_wait_seconds",
            "Time a plugin hook run waited for a slot of the gateway-wide cap on plugin code \
             running at once (`[plugins] max_concurrent_calls`), by tenant",
            plugin_gate_wait.clone(),
        );
        let upstream_starts = Counter::default();
        registry.register(
            "upstream_starts",
            "Local gpu-host processes started (restarts included)",
            upstream_starts.clone(),
        );
        let upstream_ready = Gauge::default();
        registry.register(
            "upstream_ready",
            "1 while some gpu-host takes requests (what /readyz says)",
            upstream_ready.clone(),
        );
        let plugin_uploads = Family::<PluginUploadLabels, Counter>::default();
        registry.register(
            "plugin_uploads",
            "Plugin uploads by tenant and result (the error code when refused)",
            plugin_uploads.clone(),
        );
        let model_serving = Family::<ModelLabels, Gauge>::default();
        registry.register(
            "model_serving",
            "1 while a model's resident weights match what was verified, 0 once it is out of service",
            model_serving.clone(),
        );
        let model_weights_verified_at = Family::<ModelLabels, Gauge>::default();
        registry.register(
            "model_weights_verified_at_seconds",
            "When every byte of a model's resident weights last matched (Unix time)",
            model_weights_verified_at.clone(),
        );
        let model_scrubbed_bytes = Family::<ModelLabels, Gauge>::default();
        registry.register(
            "model_scrubbed_bytes",
            "Bytes of a model's resident weights re-hashed by the gpu-host's scrub since it was loaded",
            model_scrubbed_bytes.clone(),
        );
        let model_scrub_floor_bytes = Family::<ModelLabels, Gauge>::default();
        registry.register(
            "model_scrub_floor_bytes",
            "Of the scrubbed bytes, those hashed at normal priority to keep the scrub's floor because idle CPU time was scarce",
            model_scrub_floor_bytes.clone(),
        );
        let model_weight_mismatches = Family::<ModelLabels, Counter>::default();
        registry.register(
            "model_weight_mismatches",
            "Times a model was taken out of service because its resident weights changed",
            model_weight_mismatches.clone(),
        );
        let partition_kv_blocks = Family::<PartitionTenantLabels, Gauge>::default();
        registry.register(
            "partition_kv_blocks",
            "KV-cache blocks (16 tokens) a tenant's sequences hold in a gpu-host partition",
            partition_kv_blocks.clone(),
        );
        let partition_kv_refusals = Family::<PartitionTenantLabels, Counter>::default();
        registry.register(
            "partition_kv_refusals",
            "Requests a gpu-host partition refused because they could never fit the tenant's KV budget",
            partition_kv_refusals.clone(),
        );
        let partition_running = Family::<PartitionLabels, Gauge>::default();
        registry.register(
            "partition_running",
            "Sequences holding KV cache in a gpu-host partition",
            partition_running.clone(),
        );
        let partition_queued = Family::<PartitionLabels, Gauge>::default();
        registry.register(
            "partition_queued",
            "Requests routed to a gpu-host partition, waiting to join a batch",
            partition_queued.clone(),
        );
        let partition_memory_bytes = Family::<PartitionLabels, Gauge>::default();
        registry.register(
            "partition_memory_bytes",
            "KV-cache memory budget of a gpu-host partition",
            partition_memory_bytes.clone(),
        );
        let partition_memory_used_bytes = Family::<PartitionLabels, Gauge>::default();
        registry.register(
            "partition_memory_used_bytes",
            "KV-cache bytes a gpu-host partition's blocks hold now",
            partition_memory_used_bytes.clone(),
        );
        let partition_preemptions = Family::<PartitionLabels, Counter>::default();
        registry.register(
            "partition_preemptions",
            "Sequences a gpu-host partition preempted (KV blocks taken back, recomputed later)",
            partition_preemptions.clone(),
        );
        let partition_device_errors = Family::<PartitionLabels, Counter>::default();
        registry.register(
            "partition_device_errors",
            "Steps a gpu-host partition's device failed (their requests got 503 device_error)",
            partition_device_errors.clone(),
        );
        let admin_refusals = Family::<AdminRefusalLabels, Counter>::default();
        registry.register(
            "admin_refusals",
            "Operator API calls refused before their handler, by reason",
            admin_refusals.clone(),
        );
        let connections_refused = Family::<ConnectionRefusalLabels, Counter>::default();
        registry.register(
            "connections_refused",
            "Client connections closed at accept because a [connections] cap was reached",
            connections_refused.clone(),
        );
        let lane_foreign_requests = Family::<TenantLabels, Counter>::default();
        registry.register(
            "lane_foreign_requests",
            "Requests not of the lane's tenant that came on a connection its lane serves; \
             each was answered with Connection: close",
            lane_foreign_requests.clone(),
        );
        let audit_entries = Gauge::default();
        registry.register(
            "audit_entries",
            "Entries in the audit log (acknowledged)",
            audit_entries.clone(),
        );
        let audit_bytes = Gauge::default();
        registry.register(
            "audit_bytes",
            "Size of the audit log's entries file, in bytes",
            audit_bytes.clone(),
        );
        let audit_failed = Gauge::default();
        registry.register(
            "audit_failed",
            "1 once the audit log stopped taking entries (a failed append whose file could not be cut back); until a restart",
            audit_failed.clone(),
        );
        let lane_connections = Family::<TenantLabels, Counter>::default();
        registry.register(
            "lane_connections",
            "Connections handed to a tenant's connection lane (a gateway thread on its \
             dedicated partition's CPUs)",
            lane_connections.clone(),
        );
        let limit_store_errors = Counter::default();
        registry.register(
            "limit_store_errors",
            "Calls to the shared limit store ([limits] store) that failed or timed out",
            limit_store_errors.clone(),
        );
        let limit_store_up = Gauge::default();
        registry.register(
            "limit_store_up",
            "1 while the shared limit store answers, 0 while admission falls back",
            limit_store_up.clone(),
        );
        let limit_store_fallbacks = Family::<TenantLabels, Counter>::default();
        registry.register(
            "limit_store_fallbacks",
            "Admissions decided by this replica's own limiters while the shared store was down",
            limit_store_fallbacks.clone(),
        );
        let gpu_host_up = Family::<HostLabels, Gauge>::default();
        registry.register(
            "gpu_host_up",
            "1 while a gpu-host takes new requests (answering health checks, not draining)",
            gpu_host_up.clone(),
        );
        let gpu_host_outstanding = Family::<HostLabels, Gauge>::default();
        registry.register(
            "gpu_host_outstanding",
            "Generations in flight on each gpu-host from this gateway",
            gpu_host_outstanding.clone(),
        );
        let gpu_host_ejections = Family::<HostLabels, Counter>::default();
        registry.register(
            "gpu_host_ejections",
            "Times a gpu-host was taken out of rotation after failing a request or a health check",
            gpu_host_ejections.clone(),
        );
        let gpu_host_retries = Counter::default();
        registry.register(
            "gpu_host_retries",
            "Generations retried on another gpu-host after the first failed before starting",
            gpu_host_retries.clone(),
        );
        let gpu_host_generations = Family::<HostLabels, Counter>::default();
        registry.register(
            "gpu_host_generations",
            "Generations each gpu-host started for this gateway",
            gpu_host_generations.clone(),
        );
        let trace_spans = Family::<SpanOutcomeLabels, Counter>::default();
        registry.register(
            "trace_spans",
            "Spans finished while exporting traces, by outcome: exported, dropped (the export queue was full) or failed (the collector did not take them)",
            trace_spans.clone(),
        );
        Metrics {
            registry,
            requests,
            rejections,
            tokens,
            latency,
            time_to_first_token,
            upstream_streams_open,
            policy_reloads,
            policy_reloads_unrecorded,
            audit_append_failures,
            plugin_calls,
            plugin_duration,
            plugin_gate_wait,
            upstream_starts,
            upstream_ready,
            plugin_uploads,
            model_serving,
            model_weights_verified_at,
            model_scrubbed_bytes,
            model_scrub_floor_bytes,
            model_weight_mismatches,
            partition_kv_blocks,
            partition_kv_refusals,
            partition_running,
            partition_queued,
            partition_memory_bytes,
            partition_memory_used_bytes,
            partition_preemptions,
            partition_device_errors,
            lane_connections,
            admin_refusals,
            connections_refused,
            lane_foreign_requests,
            audit_entries,
            audit_bytes,
            audit_failed,
            limit_store_errors,
            limit_store_up,
            limit_store_fallbacks,
            gpu_host_up,
            gpu_host_outstanding,
            gpu_host_ejections,
            gpu_host_retries,
            gpu_host_generations,
            trace_spans,
            span_counts: std::sync::OnceLock::new(),
            gen_ai: GenAiMetrics::new(),
        }
    }

    /// Reports `counts` (the trace export's) from now on.
    pub fn count_spans(&self, counts: std::sync::Arc<bulkhead_telemetry::SpanCounts>) {
        let _ = self.span_counts.set(counts);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        if let Some(counts) = self.span_counts.get() {
            let outcomes = [
                ("exported", counts.exported()),
                ("dropped", counts.dropped()),
                ("failed", counts.failed()),
            ];
            for (outcome, n) in outcomes {
                let counter = self
                    .trace_spans
                    .get_or_create(&SpanOutcomeLabels { outcome });
                counter.inc_by(n.saturating_sub(counter.get()));
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts one open upstream stream of `tenant` until the guard drops.
    pub fn open_stream(&self, tenant: &str) -> OpenStream {
        let gauge = self
            .upstream_streams_open
            .get_or_create(&TenantLabels {
                tenant: tenant.to_string(),
            })
            .clone();
        gauge.inc();
        OpenStream { gauge }
    }

    pub fn reject(&self, tenant: &str, reason: &'static str) {
        self.rejections
            .get_or_create(&RejectionLabels {
                tenant: tenant.to_string(),
                reason,
            })
            .inc();
    }
}

/// One open upstream stream in `bulkhead_upstream_streams_open`: the gauge
/// goes down when this drops, however the generation ended (finished,
/// failed, timed out, or its client went away and the body was dropped).
#[derive(Debug)]
pub struct OpenStream {
    gauge: Gauge,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_streams(metrics: &Metrics, tenant: &str) -> Option<i64> {
        let line = format!("bulkhead_upstream_streams_open{{tenant=\"{tenant}\"}} ");
        let text = metrics.render();
        let value = text.lines().find_map(|l| l.strip_prefix(line.as_str()))?;
        Some(value.parse().unwrap())
    }

    #[test]
    fn open_streams_count_live_guards_per_tenant() {
        let metrics = Metrics::new();
        assert_eq!(open_streams(&metrics, "acme"), None);
        let a = metrics.open_stream("acme");
        let b = metrics.open_stream("acme");
        let c = metrics.open_stream("globex");
        assert_eq!(open_streams(&metrics, "acme"), Some(2));
        assert_eq!(open_streams(&metrics, "globex"), Some(1));
        drop(a);
        assert_eq!(open_streams(&metrics, "acme"), Some(1));
        drop((b, c));
        assert_eq!(open_streams(&metrics, "acme"), Some(0));
        assert_eq!(open_streams(&metrics, "globex"), Some(0));
    }
}
