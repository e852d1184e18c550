//! What a process exports and where: a `[telemetry]` table (or nothing)
//! merged with the standard `OTEL_*` variables, which win, as the
//! OpenTelemetry specification says. Off unless an endpoint is configured.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Error;

/// `[telemetry]` as an operator writes it (the gateway reads it from
/// `gateway.toml`); every field optional.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryFile {
    /// The OTLP collector: `http://HOST:4317` for gRPC, `http://HOST:4318`
    /// for HTTP/protobuf (`/v1/traces` is appended). Absent: no export.
    pub endpoint: Option<String>,
    /// `grpc` (default) or `http/protobuf`.
    pub protocol: Option<String>,
    /// `service.name` of the gateway (default `bulkhead`).
    pub service_name: Option<String>,
    /// One of the specification's sampler names (default
    /// `parentbased_always_on`).
    pub sampler: Option<String>,
    /// The ratio of the `traceidratio` samplers, 0 to 1.
    pub sampler_arg: Option<f64>,
    /// More resource attributes (`deployment.environment = "prod"`).
    #[serde(default)]
    pub resource_attributes: BTreeMap<String, String>,
    /// Finished spans waiting for export, at most (default 2048). Past it
    /// spans are dropped and counted; a request never waits.
    pub max_queue_spans: Option<usize>,
    /// Longest one export may take, in milliseconds (default 10000).
    pub export_timeout_ms: Option<u64>,
    /// How often metrics are exported, in milliseconds (default 60000).
    pub metric_interval_ms: Option<u64>,
}

/// How spans travel to the collector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }

    fn parse(value: &str, from: &str) -> Result<Protocol, Error> {
        match value {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            other => Err(Error::Setting {
                from: from.to_string(),
                why: format!(
                    "protocol `{other}` is not supported; use `grpc` or `http/protobuf` \
                     (`http/json` is not)"
                ),
            }),
        }
    }
}

/// The specification's samplers (`OTEL_TRACES_SAMPLER`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SamplerChoice {
    AlwaysOn,
    AlwaysOff,
    TraceIdRatio(f64),
    ParentBasedAlwaysOn,
    ParentBasedAlwaysOff,
    ParentBasedTraceIdRatio(f64),
}

impl SamplerChoice {
    fn parse(name: &str, arg: Option<f64>, from: &str) -> Result<SamplerChoice, Error> {
        let ratio = || match arg {
            None => Ok(1.0),
            Some(r) if (0.0..=1.0).contains(&r) => Ok(r),
            Some(r) => Err(Error::Setting {
                from: from.to_string(),
                why: format!("the sampler's ratio is {r}; it must be between 0 and 1"),
            }),
        };
        Ok(match name {
            "always_on" => SamplerChoice::AlwaysOn,
            "always_off" => SamplerChoice::AlwaysOff,
            "traceidratio" => SamplerChoice::TraceIdRatio(ratio()?),
            "parentbased_always_on" => SamplerChoice::ParentBasedAlwaysOn,
            "parentbased_always_off" => SamplerChoice::ParentBasedAlwaysOff,
            "parentbased_traceidratio" => SamplerChoice::ParentBasedTraceIdRatio(ratio()?),
            other => {
                return Err(Error::Setting {
                    from: from.to_string(),
                    why: format!(
                        "sampler `{other}` is not one of always_on, always_off, \
                         traceidratio, parentbased_always_on, parentbased_always_off, \
                         parentbased_traceidratio"
                    ),
                });
            }
        })
    }
}

/// Export settings in force.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Where spans go: for gRPC the collector's address, for HTTP the
    /// whole URL of the traces path.
    pub endpoint: String,
    /// Where metrics go (the same rule); `None` when only the traces'
    /// own variable names a collector.
    pub metrics_endpoint: Option<String>,
    pub protocol: Protocol,
    pub service_name: String,
    pub sampler: SamplerChoice,
    pub resource: BTreeMap<String, String>,
    pub max_queue_spans: usize,
    pub export_timeout: Duration,
    pub metric_interval: Duration,
    /// Sent with every span export (`OTEL_EXPORTER_OTLP_HEADERS`, a
    /// collector's API key, say).
    pub headers: Headers,
}

/// Export request headers, validated; `Debug` shows their names only
/// (their values are credentials).
#[derive(Clone, Default, PartialEq)]
pub struct Headers(pub Vec<(http::HeaderName, http::HeaderValue)>);

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Most spans an export carries.
pub const MAX_EXPORT_BATCH: usize = 512;
const DEFAULT_QUEUE: usize = 2048;
const MAX_QUEUE: usize = 1 << 20;
const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_METRIC_INTERVAL: Duration = Duration::from_secs(60);

impl Settings {
    /// `file` merged with the variables `env` reads (the variables win);
    /// `None` when no endpoint is configured or `OTEL_SDK_DISABLED=true`.
    /// `default_service` names the process when nothing else does.
    pub fn resolve(
        file: &TelemetryFile,
        default_service: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, Error> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let (protocol, protocol_from) = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
            Some(p) => (p, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
            None => match var("OTEL_EXPORTER_OTLP_PROTOCOL") {
                Some(p) => (p, "OTEL_EXPORTER_OTLP_PROTOCOL"),
                None => (
                    file.protocol.clone().unwrap_or_else(|| "grpc".into()),
                    "[telemetry] protocol",
                ),
            },
        };
        let protocol = Protocol::parse(protocol.trim(), protocol_from)?;
        let base = match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(base) => Some((base, "OTEL_EXPORTER_OTLP_ENDPOINT")),
            None => file
                .endpoint
                .clone()
                .filter(|e| !e.trim().is_empty())
                .map(|e| (e, "[telemetry] endpoint")),
        };
        // A signal's own variable is the whole URL, as given; the base gets
        // the signal's path over HTTP.
        let signal = |own: &str, path: &str| -> Result<Option<String>, Error> {
            match (var(own), &base) {
                (Some(url), _) => checked_url(&url, own).map(Some),
                (None, Some((base, from))) => signal_url(base, protocol, path, from).map(Some),
                (None, None) => Ok(None),
            }
        };
        let Some(endpoint) = signal("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "traces")? else {
            return Ok(None);
        };
        // `OTEL_METRICS_EXPORTER=none` keeps the metrics at home (and
        // `/metrics`) while the traces go out.
        let metrics_endpoint = match var("OTEL_METRICS_EXPORTER").as_deref().map(str::trim) {
            None | Some("otlp") => signal("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "metrics")?,
            Some("none") => None,
            Some(other) => {
                return Err(Error::Setting {
                    from: "OTEL_METRICS_EXPORTER".into(),
                    why: format!("exporter `{other}` is not supported; use `otlp` or `none`"),
                });
            }
        };
        let service_name = var("OTEL_SERVICE_NAME")
            .or_else(|| file.service_name.clone())
            .unwrap_or_else(|| default_service.to_string());
        let sampler = match var("OTEL_TRACES_SAMPLER") {
            Some(name) => {
                let arg = match var("OTEL_TRACES_SAMPLER_ARG") {
                    Some(a) => Some(a.trim().parse::<f64>().map_err(|_| Error::Setting {
                        from: "OTEL_TRACES_SAMPLER_ARG".into(),
                        why: format!("`{a}` is not a number"),
                    })?),
                    None => None,
                };
                SamplerChoice::parse(name.trim(), arg, "OTEL_TRACES_SAMPLER")?
            }
            None => SamplerChoice::parse(
                file.sampler.as_deref().unwrap_or("parentbased_always_on"),
                file.sampler_arg,
                "[telemetry] sampler",
            )?,
        };
        let mut resource = file.resource_attributes.clone();
        if let Some(list) = var("OTEL_RESOURCE_ATTRIBUTES") {
            resource.extend(resource_attributes(&list)?);
        }
        let max_queue_spans = file.max_queue_spans.unwrap_or(DEFAULT_QUEUE);
        if !(1..=MAX_QUEUE).contains(&max_queue_spans) {
            return Err(Error::Setting {
                from: "[telemetry] max_queue_spans".into(),
                why: format!("{max_queue_spans} is not between 1 and {MAX_QUEUE}"),
            });
        }
        let export_timeout = match file.export_timeout_ms {
            None => DEFAULT_EXPORT_TIMEOUT,
            Some(ms @ 1..=600_000) => Duration::from_millis(ms),
            Some(ms) => {
                return Err(Error::Setting {
                    from: "[telemetry] export_timeout_ms".into(),
                    why: format!("{ms} is not between 1 and 600000"),
                });
            }
        };
        let metric_interval = match var("OTEL_METRIC_EXPORT_INTERVAL") {
            Some(ms) => milliseconds(&ms, "OTEL_METRIC_EXPORT_INTERVAL")?,
            None => match file.metric_interval_ms {
                Some(ms) => milliseconds(&ms.to_string(), "[telemetry] metric_interval_ms")?,
                None => DEFAULT_METRIC_INTERVAL,
            },
        };
        let mut headers = Headers::default();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            if let Some(list) = var(name) {
                for (key, value) in export_headers(&list, name)? {
                    headers.0.retain(|(k, _)| *k != key);
                    headers.0.push((key, value));
                }
            }
        }
        Ok(Some(Settings {
            endpoint,
            metrics_endpoint,
            protocol,
            service_name,
            sampler,
            resource,
            max_queue_spans,
            export_timeout,
            metric_interval,
            headers,
        }))
    }

    /// The variables a child process (the local gpu-host) needs to export
    /// to the same place under its own `service_name`.
    pub fn child_env(&self, service_name: &str) -> Vec<(&'static str, String)> {
        let (sampler, arg) = match self.sampler {
            SamplerChoice::AlwaysOn => ("always_on", None),
            SamplerChoice::AlwaysOff => ("always_off", None),
            SamplerChoice::TraceIdRatio(r) => ("traceidratio", Some(r)),
            SamplerChoice::ParentBasedAlwaysOn => ("parentbased_always_on", None),
            SamplerChoice::ParentBasedAlwaysOff => ("parentbased_always_off", None),
            SamplerChoice::ParentBasedTraceIdRatio(r) => ("parentbased_traceidratio", Some(r)),
        };
        let mut env = vec![
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", self.endpoint.clone()),
            (
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                self.protocol.as_str().into(),
            ),
            ("OTEL_SERVICE_NAME", service_name.to_string()),
            ("OTEL_TRACES_SAMPLER", sampler.into()),
        ];
        if let Some(arg) = arg {
            env.push(("OTEL_TRACES_SAMPLER_ARG", arg.to_string()));
        }
        let attributes: Vec<String> = self
            .resource
            .iter()
            .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
            .collect();
        env.push(("OTEL_RESOURCE_ATTRIBUTES", attributes.join(",")));
        env
    }
}

/// An endpoint URL that names its scheme and host.
fn checked_url(url: &str, from: &str) -> Result<String, Error> {
    let url = url.trim();
    let parsed: http::Uri = url.parse().map_err(|e| Error::Setting {
        from: from.to_string(),
        why: format!("`{url}` is not a URL: {e}"),
    })?;
    match (parsed.scheme_str(), parsed.host()) {
        (Some("http" | "https"), Some(_)) => Ok(url.to_string()),
        _ => Err(Error::Setting {
            from: from.to_string(),
            why: format!("`{url}` must be an http:// or https:// URL with a host"),
        }),
    }
}

/// A signal's URL from a base endpoint: gRPC uses it as is, HTTP appends
/// `v1/SIGNAL` to its path (the specification's rule for the base variable).
fn signal_url(base: &str, protocol: Protocol, signal: &str, from: &str) -> Result<String, Error> {
    let base = checked_url(base, from)?;
    Ok(match protocol {
        Protocol::Grpc => base,
        Protocol::HttpProtobuf => format!("{}/v1/{signal}", base.trim_end_matches('/')),
    })
}

/// A period in milliseconds, 100 ms to a day.
fn milliseconds(text: &str, from: &str) -> Result<Duration, Error> {
    match text.trim().parse::<u64>() {
        Ok(ms @ 100..=86_400_000) => Ok(Duration::from_millis(ms)),
        _ => Err(Error::Setting {
            from: from.to_string(),
            why: format!("`{text}` is not a number of milliseconds from 100 to 86400000"),
        }),
    }
}

/// `key1=value1,key2=value2`, values percent-decoded (W3C Baggage octets).
fn resource_attributes(list: &str) -> Result<Vec<(String, String)>, Error> {
    let bad = |why: String| Error::Setting {
        from: "OTEL_RESOURCE_ATTRIBUTES".into(),
        why,
    };
    let mut out = Vec::new();
    for pair in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| bad(format!("`{pair}` is not KEY=VALUE")))?;
        let key = percent_decode(key.trim()).map_err(&bad)?;
        if key.is_empty() {
            return Err(bad(format!("`{pair}` has an empty key")));
        }
        out.push((key, percent_decode(value.trim()).map_err(&bad)?));
    }
    Ok(out)
}

/// `key=value,...` (values percent-encoded) from the variable `from`. An
/// error names the variable and the key, never a value.
fn export_headers(
    list: &str,
    from: &str,
) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, Error> {
    let bad = |why: String| Error::Setting {
        from: from.into(),
        why,
    };
    let mut out = Vec::new();
    for (n, pair) in list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
    {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(bad(format!("entry {} is not KEY=VALUE", n + 1)));
        };
        let key = key.trim();
        let name = http::HeaderName::from_bytes(key.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad(format!("`{key}` is not a header name")))?;
        let value = percent_decode(value.trim())
            .ok()
            .and_then(|v| http::HeaderValue::from_str(&v).ok())
            .ok_or_else(|| bad(format!("the value of `{key}` is not a valid header value")))?;
        out.push((name, value));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("`{s}` has a bad percent escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` is not UTF-8 once decoded"))
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn file(endpoint: &str) -> TelemetryFile {
        TelemetryFile {
            endpoint: Some(endpoint.into()),
            ..TelemetryFile::default()
        }
    }

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        let none = Settings::resolve(&TelemetryFile::default(), "svc", env(&[])).unwrap();
        assert_eq!(none, None);
        let disabled = Settings::resolve(
            &file("http://c:4317"),
            "svc",
            env(&[("OTEL_SDK_DISABLED", "TRUE")]),
        )
        .unwrap();
        assert_eq!(disabled, None);
    }

    #[test]
    fn export_headers_merge_the_signal_over_the_base_and_never_show_a_value() {
        let s = Settings::resolve(
            &file("http://c:4317"),
            "svc",
            env(&[
                ("OTEL_EXPORTER_OTLP_HEADERS", "X-Api-Key=base, tenant=a%2Cb"),
                ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key=s3cr%3Dt"),
            ]),
        )
        .unwrap()
        .unwrap();
        let got: Vec<(&str, &str)> = s
            .headers
            .0
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(got, [("tenant", "a,b"), ("x-api-key", "s3cr=t")]);
        let shown = format!("{s:?}");
        assert!(
            shown.contains("x-api-key") && !shown.contains("s3cr"),
            "{shown}"
        );
        assert!(!shown.contains("a,b"), "{shown}");

        for (list, named) in [
            ("novalue", "entry 1 is not KEY=VALUE"),
            ("bad key=1", "`bad key` is not a header name"),
            (
                "k=sec%0Aret",
                "the value of `k` is not a valid header value",
            ),
            (
                "k=sec%zzret",
                "the value of `k` is not a valid header value",
            ),
        ] {
            let e = Settings::resolve(
                &file("http://c:4317"),
                "svc",
                env(&[("OTEL_EXPORTER_OTLP_HEADERS", list)]),
            )
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("OTEL_EXPORTER_OTLP_HEADERS: "), "{e}");
            assert!(e.contains(named), "{e}");
            assert!(!e.contains("sec"), "a value was shown: {e}");
        }
    }

    #[test]
    fn the_variables_win_over_the_file() {
        let mut f = file("http://file:4317");
        f.service_name = Some("from-file".into());
        f.sampler = Some("always_off".into());
        f.resource_attributes
            .insert("deployment.environment".into(), "file".into());
        let s = Settings::resolve(
            &f,
            "svc",
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318/"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_SERVICE_NAME", "from-env"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod, team=a%20b",
                ),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint, "http://env:4318/v1/traces");
        assert_eq!(
            s.metrics_endpoint.as_deref(),
            Some("http://env:4318/v1/metrics")
        );
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.service_name, "from-env");
        assert_eq!(s.sampler, SamplerChoice::ParentBasedTraceIdRatio(0.25));
        assert_eq!(s.resource["deployment.environment"], "prod");
        assert_eq!(s.resource["team"], "a b");
    }

    #[test]
    fn the_file_alone_configures_with_defaults() {
        let s = Settings::resolve(&file("http://c:4317"), "bulkhead", env(&[]))
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoint, "http://c:4317");
        assert_eq!(s.protocol, Protocol::Grpc);
        assert_eq!(s.service_name, "bulkhead");
        assert_eq!(s.sampler, SamplerChoice::ParentBasedAlwaysOn);
        assert_eq!(s.max_queue_spans, DEFAULT_QUEUE);
    }

    #[test]
    fn the_signal_variable_is_taken_whole() {
        let s = Settings::resolve(
            &TelemetryFile::default(),
            "svc",
            env(&[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint, "http://c:4318/custom");
        assert_eq!(s.metrics_endpoint, None, "no base: metrics stay off");
    }

    #[test]
    fn the_metrics_exporter_variable_turns_metrics_off_alone() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
        let metrics = |exporter: Option<&'static str>| {
            let mut vars = vec![base];
            vars.extend(exporter.map(|e| ("OTEL_METRICS_EXPORTER", e)));
            let s = Settings::resolve(&TelemetryFile::default(), "svc", env(&vars))
                .unwrap()
                .unwrap();
            assert_eq!(s.endpoint, "http://c:4317", "traces still go out");
            s.metrics_endpoint
        };
        assert_eq!(metrics(None).as_deref(), Some("http://c:4317"));
        assert_eq!(metrics(Some("otlp")).as_deref(), Some("http://c:4317"));
        assert_eq!(metrics(Some("none")), None);
    }

    #[test]
    fn bad_values_name_where_they_came_from() {
        type Case = (
            TelemetryFile,
            Vec<(&'static str, &'static str)>,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            (file("not a url"), vec![], "[telemetry] endpoint"),
            (file("ftp://c:1"), vec![], "[telemetry] endpoint"),
            (
                file("http://c:1"),
                vec![("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                file("http://c:1"),
                vec![("OTEL_TRACES_SAMPLER", "sometimes")],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                file("http://c:1"),
                vec![
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ],
                "OTEL_TRACES_SAMPLER",
            ),
            (
                file("http://c:1"),
                vec![("OTEL_RESOURCE_ATTRIBUTES", "novalue")],
                "OTEL_RESOURCE_ATTRIBUTES",
            ),
            (
                file("http://c:1"),
                vec![("OTEL_METRIC_EXPORT_INTERVAL", "5")],
                "OTEL_METRIC_EXPORT_INTERVAL",
            ),
            (
                file("http://c:1"),
                vec![("OTEL_METRICS_EXPORTER", "prometheus")],
                "OTEL_METRICS_EXPORTER",
            ),
            (
                TelemetryFile {
                    max_queue_spans: Some(0),
                    ..file("http://c:1")
                },
                vec![],
                "[telemetry] max_queue_spans",
            ),
        ];
        for (f, vars, from) in cases {
            let err = Settings::resolve(&f, "svc", env(&vars)).unwrap_err();
            assert!(err.to_string().starts_with(from), "{err} (expected {from})");
        }
    }

    #[test]
    fn a_child_reads_back_what_its_parent_resolved() {
        let mut f = file("http://c:4318");
        f.protocol = Some("http/protobuf".into());
        f.sampler = Some("traceidratio".into());
        f.sampler_arg = Some(0.5);
        f.resource_attributes.insert("k=,".into(), "v w".into());
        let parent = Settings::resolve(&f, "bulkhead", env(&[]))
            .unwrap()
            .unwrap();
        let vars: Vec<(&str, String)> = parent.child_env("bulkhead-gpu-host");
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let child = Settings::resolve(&TelemetryFile::default(), "x", env(&pairs))
            .unwrap()
            .unwrap();
        assert_eq!(child.endpoint, parent.endpoint);
        assert_eq!(child.protocol, parent.protocol);
        assert_eq!(child.sampler, parent.sampler);
        assert_eq!(child.resource, parent.resource);
        assert_eq!(child.service_name, "bulkhead-gpu-host");
    }
}
