//! `POST /v1/chat/completions` and `POST /v1/completions`.
//!
//! The request path is a sequence of typed stages; each either hands the next
//! one its input or ends the request with an [`ApiError`]:
//!
//! ```text
//! headers ─auth (routes.rs, before the body is read)─▶ TenantCall
//!     +body ─shape,model─▶ Validated ─limits─▶ Admitted
//!     ─on-request plugins─▶ Processed ─gRPC─▶ Generation (Started seen)
//!     ─on-response / on-chunk plugins─▶ JSON body | SSE stream
//! ```
//! Nothing reaches the gpu-host before `Admitted`, so a refused request costs
//! no GPU work; plugins run after admission, so the tenant's rate limits
//! bound the plugin work it can cause (see `hooks`).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response, Sse};
use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::deadline::BodyDeadline;
use super::error::{ApiError, header_map};
use super::generation::{Generation, GenerationContext, GenerationSpans};
use super::identity::TenantCall;
use super::openai::{COMPLETIONS_DEFAULT_MAX_TOKENS, Endpoint, InferenceRequest};
use super::respond::ResponseMeta;
use super::{App, random_seed, request_id, trace};
use crate::Snapshot;
use crate::audit::time::Timestamp;
use crate::limits::{Admission, OnStoreError, StoreUnavailable, hour_of};
use crate::metrics::{RequestLabels, TenantLabels};
use crate::pipeline::{Hooks, TenantRules, effective_max_tokens};
use crate::policy::TenantPolicy;
use crate::upstream::Generate;

pub async fn chat(
    State(app): State<App>,
    Extension(call): Extension<TenantCall>,
    body: Body,
) -> Response {
    match body {
        Ok(body) => handle(app, call, Endpoint::Chat, body).await,
        Err(rejection) => body_error(&app, &call, Endpoint::Chat, rejection),
    }
}

pub async fn completions(
    State(app): State<App>,
    Extension(call): Extension<TenantCall>,
    body: Body,
) -> Response {
    match body {
        Ok(body) => handle(app, call, Endpoint::Completion, body).await,
        Err(rejection) => body_error(&app, &call, Endpoint::Completion, rejection),
    }
}

/// The body, or why it could not be read (too large for the gateway's cap,
/// or the connection failed while sending it).
type Body = Result<Bytes, BytesRejection>;

/// A body that could not be read, as an OpenAI error.
fn body_error(
    app: &App,
    call: &TenantCall,
    endpoint: Endpoint,
    rejection: BytesRejection,
) -> Response {
    let tenant = call.identity.tenant.clone();
    let error = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(
            "the body is larger than the gateway accepts (gateway.toml max_body_bytes)",
        )
    } else if let Some(late) = BodyDeadline::caused(&rejection) {
        ApiError::body_timeout(late)
    } else {
        ApiError::invalid_body(format!("the body could not be read: {rejection}"))
    };
    app.metrics.reject(&tenant, error.code);
    app.metrics
        .requests
        .get_or_create(&RequestLabels {
            tenant,
            endpoint: endpoint.name(),
            status: error.status.as_u16(),
        })
        .inc();
    error.into_response()
}

async fn handle(app: App, call: TenantCall, endpoint: Endpoint, body: Bytes) -> Response {
    let started_at = Instant::now();
    let request_id = request_id();
    let tenant = call.identity.tenant.clone();
    // The route's server span (`trace.rs`).
    let span = Span::current();
    span.record("gen_ai.operation.name", operation_name(endpoint));
    let response = match serve(&app, call, endpoint, body, started_at, &request_id).await {
        Ok(response) => response,
        Err(error) => {
            trace::record_error(&span, error.code);
            app.metrics.reject(&tenant, error.code);
            error.into_response()
        }
    };
    app.metrics
        .requests
        .get_or_create(&RequestLabels {
            tenant,
            endpoint: endpoint.name(),
            status: response.status().as_u16(),
        })
        .inc();
    let mut response = response;
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response
            .headers_mut()
            .insert(HeaderName::from_static("x-request-id"), value);
    }
    response
}

/// What every stage of one request may read.
struct Call<'a> {
    app: &'a App,
    request_id: &'a str,
    started_at: Instant,
}

/// A body that passed the tenant's shape, model and size checks, with the
/// `max_tokens` it gets. Nothing has been spent on it yet.
struct Validated<'a> {
    tenant: &'a TenantPolicy,
    request: InferenceRequest,
    max_tokens: u32,
}

/// A validated request the tenant's limits let in, holding its rate,
/// concurrency and token reservation until it ends. Nothing reaches the
/// gpu-host before this.
struct Admitted<'a> {
    validated: Validated<'a>,
    admission: Admission,
    deadline: tokio::time::Instant,
}

/// An admitted request after its `on-request` plugins: what goes upstream,
/// and the hooks its response still passes through.
struct Processed<'a> {
    admitted: Admitted<'a>,
    hooks: Option<Hooks>,
}

async fn serve(
    app: &App,
    call: TenantCall,
    endpoint: Endpoint,
    body: Bytes,
    started_at: Instant,
    request_id: &str,
) -> Result<Response, ApiError> {
    // Authenticated (with the route's scope): by the route's check.
    let TenantCall { identity, snapshot } = call;
    let tenant = snapshot
        .policy
        .tenants
        .get(&identity.tenant)
        .ok_or_else(|| ApiError::internal("a verified tenant is missing from the policy"))?;
    let call = Call {
        app,
        request_id,
        started_at,
    };
    let validated = validate(tenant, endpoint, &body)?;
    record_request(&Span::current(), &validated);
    let hooks = Hooks::resolve(
        &tenant.id,
        &tenant.plugins,
        |name| app.plugins.get(&tenant.id, name),
        &app.metrics,
        &app.plugin_gate,
    )?;
    let admitted = admit(validated, &snapshot, identity.sub.as_deref(), &call).await?;
    let rate_headers = header_map(admitted.admission.headers().to_header_pairs());
    let result = async {
        let processed = process(admitted, hooks, &call).await?;
        run(processed, &call).await
    }
    .await;
    Ok(match result {
        Ok(mut response) => {
            response.headers_mut().extend(rate_headers);
            response
        }
        Err(error) => error.with_headers(rate_headers).into_response(),
    })
}

/// Admission: the request's estimate (prompt bound + `max_tokens`) against
/// the tenant's limits: in the shared store when there is one and it
/// answers, else in `snapshot`'s limiters (this replica's share of them),
/// or refused, as `on_store_error` says.
async fn admit<'a>(
    validated: Validated<'a>,
    snapshot: &Snapshot,
    sub: Option<&str>,
    call: &Call<'_>,
) -> Result<Admitted<'a>, ApiError> {
    let span = tracing::info_span!(
        target: trace::TARGET,
        "admission",
        bulkhead.admission.outcome = Empty,
        bulkhead.admission.limit = Empty,
        bulkhead.admission.store = if call.app.shared_limits.is_some() { "shared" } else { "local" },
    );
    let admitted = admit_in(validated, snapshot, sub, call)
        .instrument(span.clone())
        .await;
    match &admitted {
        Ok(_) => span.record("bulkhead.admission.outcome", "admitted"),
        Err(error) => {
            span.record("bulkhead.admission.outcome", "refused");
            // The limit that decided (`rate_limit_requests`, ...).
            span.record("bulkhead.admission.limit", error.code)
        }
    };
    admitted
}

async fn admit_in<'a>(
    validated: Validated<'a>,
    snapshot: &Snapshot,
    sub: Option<&str>,
    call: &Call<'_>,
) -> Result<Admitted<'a>, ApiError> {
    let estimate = validated.request.prompt_token_bound() + u64::from(validated.max_tokens);
    let tenant = &validated.tenant.id;
    let decided = match &call.app.shared_limits {
        None => snapshot.limiters.admit(tenant, sub, estimate),
        Some(shared) => match shared
            .admit(tenant, &validated.tenant.limits, sub, estimate)
            .await
        {
            Ok(decided) => decided,
            Err(StoreUnavailable) => match shared.on_error() {
                OnStoreError::Local => {
                    let labels = TenantLabels {
                        tenant: tenant.clone(),
                    };
                    call.app
                        .metrics
                        .limit_store_fallbacks
                        .get_or_create(&labels)
                        .inc();
                    snapshot.limiters.admit(tenant, sub, estimate)
                }
                OnStoreError::Deny => {
                    return Err(ApiError::unavailable(
                        "limits_unavailable",
                        "the rate-limit store is not answering, so no request can be \
                         admitted now; retry shortly",
                    )
                    .with_headers(header_map(vec![("retry-after", "1".into())])));
                }
            },
        },
    };
    let admission = decided.map_err(ApiError::from)?;
    let deadline =
        tokio::time::Instant::from_std(call.started_at + snapshot.policy.gateway.request_timeout);
    Ok(Admitted {
        validated,
        admission,
        deadline,
    })
}

/// The tenant's `on-request` chain, if it has one, over the admitted
/// request (a rewrite is checked like a client's request).
async fn process<'a>(
    admitted: Admitted<'a>,
    hooks: Option<Hooks>,
    call: &Call<'_>,
) -> Result<Processed<'a>, ApiError> {
    let Admitted {
        validated:
            Validated {
                tenant,
                request,
                max_tokens,
            },
        admission,
        deadline,
    } = admitted;
    let (hooks, request, max_tokens) = match hooks {
        Some(hooks) if hooks.has_request_chain() => {
            let rules = Arc::new(TenantRules::of(tenant));
            let (hooks, request) = hooks
                .on_request(request, rules, call.request_id.to_string())
                .await?;
            let max_tokens = effective_max_tokens(&request, tenant.limits.max_tokens);
            (Some(hooks), request, max_tokens)
        }
        hooks => (hooks, request, max_tokens),
    };
    let validated = Validated {
        tenant,
        request,
        max_tokens,
    };
    Ok(Processed {
        admitted: Admitted {
            validated,
            admission,
            deadline,
        },
        hooks,
    })
}

/// Parses the body and applies the tenant's shape limits.
fn validate<'a>(
    tenant: &'a TenantPolicy,
    endpoint: Endpoint,
    body: &[u8],
) -> Result<Validated<'a>, ApiError> {
    let limits = &tenant.limits;
    if body.len() as u64 > limits.max_body_bytes {
        return Err(ApiError::too_large(format!(
            "the body is {} bytes; tenant `{}` may send at most {}",
            body.len(),
            tenant.id,
            limits.max_body_bytes
        )));
    }
    let request = InferenceRequest::parse(endpoint, body)?;
    if !tenant.models.contains(&request.model) {
        return Err(ApiError::forbidden(
            "model_not_allowed",
            format!(
                "tenant `{}` may not use model `{}`; GET /v1/models lists the models it may use",
                tenant.id, request.model
            ),
        ));
    }
    let max_tokens = match request.max_tokens {
        Some(n) if n > limits.max_tokens => {
            return Err(ApiError::invalid_param(
                if endpoint == Endpoint::Chat {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                },
                format!(
                    "max_tokens is {n}; tenant `{}` may ask for at most {}",
                    tenant.id, limits.max_tokens
                ),
            ));
        }
        Some(n) => n,
        None => match endpoint {
            Endpoint::Chat => limits.max_tokens,
            Endpoint::Completion => COMPLETIONS_DEFAULT_MAX_TOKENS.min(limits.max_tokens),
        },
    };
    Ok(Validated {
        tenant,
        request,
        max_tokens,
    })
}

/// Sends the processed request upstream and builds the response.
async fn run(processed: Processed<'_>, call: &Call<'_>) -> Result<Response, ApiError> {
    let Processed {
        admitted:
            Admitted {
                validated:
                    Validated {
                        tenant,
                        request,
                        max_tokens,
                    },
                admission,
                deadline,
            },
        hooks,
    } = processed;
    let Call {
        app,
        request_id,
        started_at,
    } = *call;
    // Checked here, after the plugins, so a rewritten model is checked too.
    let registration = app.models.get(&request.model).ok_or_else(|| {
        ApiError::not_found(
            "model_not_found",
            format!(
                "model `{}` is not registered on this gateway",
                request.model
            ),
        )
    })?;
    let meta = ResponseMeta::new(request.endpoint, request_id, &request.model);
    let request_span = Span::current();
    request_span.record("gen_ai.response.id", meta.id.as_str());
    let (stream, include_usage) = (request.stream, request.include_usage);
    let upstream_request = to_upstream(request, max_tokens, tenant, request_id);
    // Text only for a tenant that opted in (`[telemetry] record_content`).
    let output_text = tenant.record_content.then(|| {
        trace::record_input(&request_span, &upstream_request.prompt);
        trace::OutputText::default()
    });
    // The gpu-host's spans are children of this one (`Upstream::generate`
    // sends its context); it lasts until the stream ends.
    let upstream_span =
        tracing::info_span!(target: trace::TARGET, "upstream", otel.kind = "client");
    // Wait for Started before answering: a host that fails before
    // generating still gets an honest HTTP status.
    let generate = app
        .hosts
        .generate(upstream_request, deadline)
        .instrument(upstream_span.clone());
    let (started, events) = tokio::time::timeout_at(deadline, generate)
        .await
        .map_err(|_| {
            ApiError::timeout(
                "the gpu-host did not start the generation before the request timeout",
            )
        })??;
    if started.model_digest != registration.digest {
        // Dropping the stream cancels the generation.
        return Err(ApiError::unavailable(
            "model_unavailable",
            format!(
                "the gpu-host serves other weights under `{}` than its registration \
                 ({}); they are not served",
                registration.name, registration.digest
            ),
        ));
    }
    let weights = VerifiedWeights {
        digest: started.model_digest.clone(),
        verified_at_unix_ms: started.weights_verified_at_unix_ms,
    };
    let generation = Generation::start(
        started,
        events,
        GenerationContext {
            admission,
            deadline,
            max_tokens,
            meta,
            tenant: tenant.id.clone(),
            metrics: Arc::clone(&app.metrics),
            usage: app
                .usage
                .start(&tenant.id, &registration.name, hour_of(SystemTime::now())),
            started_at,
            spans: GenerationSpans {
                request: request_span,
                _upstream: upstream_span,
                output_text,
            },
        },
    );
    // Only plugins with response hooks see the output.
    let hooks = hooks.filter(Hooks::has_response_chain);
    let mut response = if stream {
        Sse::new(generation.into_sse(include_usage, hooks)).into_response()
    } else {
        Json(generation.collect(hooks).await?).into_response()
    };
    response.headers_mut().extend(weights_headers(&weights));
    Ok(response)
}

/// Which weights answered, as the gpu-host verified them.
#[derive(Debug)]
struct VerifiedWeights {
    digest: String,
    verified_at_unix_ms: u64,
}

/// `x-bulkhead-model-digest` and `x-bulkhead-weights-verified-at` (RFC 3339).
fn weights_headers(weights: &VerifiedWeights) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let pairs = [
        ("x-bulkhead-model-digest", weights.digest.clone()),
        (
            "x-bulkhead-weights-verified-at",
            Timestamp(weights.verified_at_unix_ms).to_string(),
        ),
    ];
    for (name, value) in pairs {
        // A digest from the host that is not a valid header value is left out
        // rather than failing a finished generation.
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    headers
}

fn to_upstream(
    request: InferenceRequest,
    max_tokens: u32,
    tenant: &TenantPolicy,
    request_id: &str,
) -> Generate {
    // Without max_tokens OpenAI generates until the context is full; the
    // tenant's maximum still caps it.
    let (max_tokens, max_tokens_cap) = match request.max_tokens {
        Some(_) => (Some(max_tokens), None),
        None => (None, Some(max_tokens)),
    };
    // Without a seed OpenAI's sampling is not reproducible; draw one.
    let seed = request.seed.unwrap_or_else(random_seed);
    Generate {
        model: request.model,
        prompt: request.prompt,
        max_tokens,
        max_tokens_cap,
        temperature: request.temperature,
        top_p: request.top_p,
        top_k: request.top_k,
        min_p: request.min_p,
        repetition_penalty: request.repetition_penalty,
        seed,
        stop: request.stop,
        tenant: tenant.id.clone(),
        request_id: request_id.to_string(),
        priority: request.priority,
        parse_special: tenant.parse_special,
    }
}

/// `gen_ai.operation.name` of an endpoint.
fn operation_name(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "chat",
        Endpoint::Completion => "text_completion",
    }
}

/// The GenAI request attributes on the server span. Never the prompt.
/// One record of all three: each record is a trip through every layer.
fn record_request(span: &Span, validated: &Validated<'_>) {
    tracing::record_all!(
        span,
        gen_ai.request.model = validated.request.model.as_str(),
        gen_ai.request.max_tokens = i64::from(validated.max_tokens),
        gen_ai.request.temperature = f64::from(validated.request.temperature),
    );
}
