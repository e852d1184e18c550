//! The OpenTelemetry GenAI metrics (`gen_ai.*`), exported over OTLP.

/// The OpenTelemetry GenAI metrics, with the operation, model and tenant
/// as attributes, exported over OTLP when `[telemetry]` configures it (the
/// instruments are no-ops otherwise). Created after telemetry is set up.
///
/// Each (operation, model, tenant) gets its instruments bound to its
/// attributes the first time it is seen. An unbound record makes the SDK
/// hash the attribute set and look it up on every call (measured: four
/// records cost the gateway more than all of a request's spans took to
/// make); a bound one is a direct write.
#[derive(Debug)]
pub struct GenAiMetrics {
    token_usage: opentelemetry::metrics::Histogram<u64>,
    request_duration: opentelemetry::metrics::Histogram<f64>,
    time_to_first_token: opentelemetry::metrics::Histogram<f64>,
    time_per_output_token: opentelemetry::metrics::Histogram<f64>,
    /// Tenant → its series. Bounded by [`MAX_GEN_AI_SERIES`].
    series: std::sync::RwLock<BoundSeries>,
}

#[derive(Debug, Default)]
struct BoundSeries {
    by_tenant: std::collections::HashMap<String, Vec<Series>>,
    count: usize,
}

/// Series bound at most; past that, records go unbound (the SDK's own
/// cardinality limit then applies). Tenants and served models are the
/// operator's, so this is far above any real count.
const MAX_GEN_AI_SERIES: usize = 4096;

/// One (operation, model, tenant)'s instruments, each bound at its first
/// record: a bound instrument exports a point even while it is empty (a
/// count of 0), which one never recorded must not.
#[derive(Debug)]
struct Series {
    operation: &'static str,
    model: String,
    request_duration: Bound<f64>,
    time_to_first_token: Bound<f64>,
    time_per_output_token: Bound<f64>,
    input_tokens: Bound<u64>,
    output_tokens: Bound<u64>,
}

type Bound<T> = std::sync::OnceLock<opentelemetry::metrics::BoundHistogram<T>>;

/// Records `value` in `bound`, binding `histogram` to `attributes` first.
fn record<T>(
    bound: &Bound<T>,
    histogram: &opentelemetry::metrics::Histogram<T>,
    attributes: impl FnOnce() -> Vec<opentelemetry::KeyValue>,
    value: T,
) {
    bound
        .get_or_init(|| histogram.bind(&attributes()))
        .record(value);
}

impl BoundSeries {
    fn find(&self, call: GenAiCall<'_>) -> Option<&Series> {
        self.by_tenant
            .get(call.tenant)?
            .iter()
            .find(|s| s.operation == call.operation && s.model == call.model)
    }
}

/// One generation as the GenAI metrics describe it.
#[derive(Clone, Copy, Debug)]
pub struct GenAiCall<'a> {
    /// `chat` or `text_completion`.
    pub operation: &'static str,
    pub model: &'a str,
    pub tenant: &'a str,
}

impl GenAiCall<'_> {
    fn attributes(&self) -> [opentelemetry::KeyValue; 3] {
        use opentelemetry::KeyValue;
        [
            KeyValue::new("gen_ai.operation.name", self.operation),
            KeyValue::new("gen_ai.request.model", self.model.to_string()),
            KeyValue::new("bulkhead.tenant", self.tenant.to_string()),
        ]
    }

    fn with_type(&self, kind: &'static str) -> Vec<opentelemetry::KeyValue> {
        let mut attributes = self.attributes().to_vec();
        attributes.push(opentelemetry::KeyValue::new("gen_ai.token.type", kind));
        attributes
    }
}

impl GenAiMetrics {
    pub(super) fn new() -> GenAiMetrics {
        GenAiMetrics::with_meter(opentelemetry::global::meter("bulkhead"))
    }

    fn with_meter(meter: opentelemetry::metrics::Meter) -> GenAiMetrics {
        // The buckets the GenAI semantic conventions advise.
        let seconds = |name: &'static str, about: &'static str, bounds: &[f64]| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(about)
                .with_boundaries(bounds.to_vec())
                .build()
        };
        GenAiMetrics {
            token_usage: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Input and output tokens per generation")
                .with_boundaries((0..14).map(|i| 4f64.powi(i)).collect())
                .build(),
            request_duration: seconds(
                "gen_ai.server.request.duration",
                "Time from the request's arrival to its last token",
                &[
                    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92,
                ],
            ),
            time_to_first_token: seconds(
                "gen_ai.server.time_to_first_token",
                "Time from the request's arrival to its first text",
                &[
                    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0,
                ],
            ),
            time_per_output_token: seconds(
                "gen_ai.server.time_per_output_token",
                "Time per output token after the first",
                &[
                    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                ],
            ),
            series: Default::default(),
        }
    }

    /// Runs `f` on `call`'s bound series, binding it the first time;
    /// `None` past [`MAX_GEN_AI_SERIES`].
    fn with_series<T>(&self, call: GenAiCall<'_>, f: impl FnOnce(&Series) -> T) -> Option<T> {
        use std::sync::PoisonError;
        if let Some(series) = self
            .series
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .find(call)
        {
            return Some(f(series));
        }
        let mut all = self.series.write().unwrap_or_else(PoisonError::into_inner);
        if all.find(call).is_none() {
            if all.count >= MAX_GEN_AI_SERIES {
                return None;
            }
            let series = Series {
                operation: call.operation,
                model: call.model.to_string(),
                request_duration: Bound::new(),
                time_to_first_token: Bound::new(),
                time_per_output_token: Bound::new(),
                input_tokens: Bound::new(),
                output_tokens: Bound::new(),
            };
            all.count += 1;
            all.by_tenant
                .entry(call.tenant.to_string())
                .or_default()
                .push(series);
        }
        all.find(call).map(f)
    }

    pub fn first_token(&self, call: GenAiCall<'_>, seconds: f64) {
        let attributes = || call.attributes().to_vec();
        let bound = self.with_series(call, |s| {
            record(
                &s.time_to_first_token,
                &self.time_to_first_token,
                attributes,
                seconds,
            );
        });
        if bound.is_none() {
            self.time_to_first_token.record(seconds, &call.attributes());
        }
    }

    /// A generation that finished: its tokens, its whole time, and the time
    /// per output token after the first (when there were two or more).
    pub fn finished(
        &self,
        call: GenAiCall<'_>,
        tokens: (u32, u32),
        seconds: f64,
        per_output_token: Option<f64>,
    ) {
        let attributes = || call.attributes().to_vec();
        let bound = self.with_series(call, |s| {
            record(
                &s.request_duration,
                &self.request_duration,
                attributes,
                seconds,
            );
            if let Some(per) = per_output_token {
                let per_token = &self.time_per_output_token;
                record(&s.time_per_output_token, per_token, attributes, per);
            }
            let (input, output) = (u64::from(tokens.0), u64::from(tokens.1));
            let typed = |kind| move || call.with_type(kind);
            record(&s.input_tokens, &self.token_usage, typed("input"), input);
            record(&s.output_tokens, &self.token_usage, typed("output"), output);
        });
        if bound.is_some() {
            return;
        }
        let attributes = call.attributes();
        self.request_duration.record(seconds, &attributes);
        if let Some(per) = per_output_token {
            self.time_per_output_token.record(per, &attributes);
        }
        self.token_usage
            .record(u64::from(tokens.0), &call.with_type("input"));
        self.token_usage
            .record(u64::from(tokens.1), &call.with_type("output"));
    }
}

#[cfg(test)]
mod gen_ai_tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
    use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
    use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};

    use super::{GenAiCall, GenAiMetrics};

    /// An exported point: metric, sorted attributes, count, sum.
    type Point = (String, Vec<(String, String)>, u64, f64);
    type Points = Vec<Point>;

    #[derive(Clone, Default)]
    struct Keep(Arc<Mutex<Points>>);

    impl PushMetricExporter for Keep {
        async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
            let mut kept = self.0.lock().unwrap();
            kept.clear();
            for metric in metrics.scope_metrics().flat_map(|s| s.metrics()) {
                let attrs = |a: &mut dyn Iterator<Item = &KeyValue>| {
                    let mut a: Vec<(String, String)> = a
                        .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                        .collect();
                    a.sort();
                    a
                };
                let name = metric.name().to_string();
                match metric.data() {
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            kept.push((
                                name.clone(),
                                attrs(&mut p.attributes()),
                                p.count(),
                                p.sum(),
                            ));
                        }
                    }
                    AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            let sum = p.sum() as f64;
                            kept.push((name.clone(), attrs(&mut p.attributes()), p.count(), sum));
                        }
                    }
                    other => panic!("{name}: not a histogram: {other:?}"),
                }
            }
            Ok(())
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
        fn temporality(&self) -> Temporality {
            Temporality::Cumulative
        }
    }

    fn point<'a>(points: &'a Points, metric: &str, attrs: &[(&str, &str)]) -> (u64, f64) {
        let mut want: Vec<(String, String)> = attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        want.sort();
        let found: Vec<&'a Point> = points
            .iter()
            .filter(|p| p.0 == metric && p.1 == want)
            .collect();
        assert_eq!(found.len(), 1, "{metric} {want:?} in {points:#?}");
        (found[0].2, found[0].3)
    }

    /// Each (operation, model, tenant) records into its own series, with
    /// the same attributes an unbound record would carry.
    #[test]
    fn bound_series_export_per_operation_model_and_tenant() {
        let keep = Keep::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(keep.clone()).build())
            .build();
        let metrics = GenAiMetrics::with_meter(provider.meter("bulkhead"));
        let chat = GenAiCall {
            operation: "chat",
            model: "m1",
            tenant: "acme",
        };
        let other = GenAiCall {
            operation: "text_completion",
            model: "m1",
            tenant: "globex",
        };
        metrics.first_token(chat, 0.25);
        metrics.finished(chat, (3, 5), 1.0, Some(0.1));
        metrics.finished(chat, (2, 1), 0.5, None);
        metrics.finished(other, (7, 1), 2.0, None);
        provider.force_flush().unwrap();
        let points = keep.0.lock().unwrap().clone();

        let acme = [
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.request.model", "m1"),
            ("bulkhead.tenant", "acme"),
        ];
        let globex = [
            ("gen_ai.operation.name", "text_completion"),
            ("gen_ai.request.model", "m1"),
            ("bulkhead.tenant", "globex"),
        ];
        let duration = "gen_ai.server.request.duration";
        assert_eq!(point(&points, duration, &acme), (2, 1.5));
        assert_eq!(point(&points, duration, &globex), (1, 2.0));
        let ttft = "gen_ai.server.time_to_first_token";
        assert_eq!(point(&points, ttft, &acme), (1, 0.25));
        let per = "gen_ai.server.time_per_output_token";
        assert_eq!(point(&points, per, &acme), (1, 0.1));
        let usage = "gen_ai.client.token.usage";
        let typed = |base: &[(&'static str, &'static str); 3], kind| {
            let mut a = base.to_vec();
            a.push(("gen_ai.token.type", kind));
            a
        };
        assert_eq!(point(&points, usage, &typed(&acme, "input")), (2, 5.0));
        assert_eq!(point(&points, usage, &typed(&acme, "output")), (2, 6.0));
        assert_eq!(point(&points, usage, &typed(&globex, "input")), (1, 7.0));
        // Nothing else: no empty globex first token or time per token, no
        // second series per key.
        assert_eq!(points.len(), 8, "{points:#?}");
    }
}
