//! Tenant plugins on the request path: the tenant's chains resolved to
//! compiled plugins, one instance per plugin per request, and the hooks run
//! in chain order on a blocking thread.
//!
//! ```text
//! Admitted ─on-request chain─▶ (rewritten request, checked again) ─▶ gpu-host
//!   whole:  text ─on-response chain─▶ body
//!   stream: delta ─on-chunk chain─▶ SSE chunk … end ─on-stream-end─▶ last chunk
//! ```
//!
//! A plugin that appears in both chains gets one instance for the whole
//! request, so it can carry what it saw in the request over to the response.
//! A rejection ends the request with the plugin's status and message; a
//! failure (trap, deadline, memory, output size, an invalid rewrite) ends it
//! with 502 `plugin_error` naming the plugin and the limit. Neither touches
//! the gateway or any other request.

use std::sync::Arc;
use std::time::Instant;

use crate::metrics::{HookLabels, Metrics, PluginCallLabels, TenantLabels};
use crate::plugins::{
    self, CallContext, CompiledPlugin, Hook, HookGate, PluginCall, PluginError, Rejection,
};
use crate::policy::{PluginSettings, TenantPlugins, TenantPolicy};
use crate::request::{
    COMPLETIONS_DEFAULT_MAX_TOKENS, Endpoint, Finish, InferenceRequest, MAX_MESSAGES, MAX_STOP,
    MAX_STOP_BYTES, Prompt,
};

/// A tenant's plugins for one request. Moved onto a blocking thread for
/// each hook and back.
pub struct Hooks {
    tenant: Arc<str>,
    slots: Vec<Slot>,
    /// Indexes into `slots`, in chain order.
    on_request: Vec<usize>,
    on_response: Vec<usize>,
    metrics: Arc<Metrics>,
    /// Every hook run waits for a slot here first.
    gate: Arc<HookGate>,
    /// The span plugin calls are children of: the request's (current when
    /// the hooks were resolved; they run on the gate's threads, and the
    /// stream's hooks after the handler returned).
    parent: tracing::Span,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("tenant", &self.tenant)
            .field(
                "plugins",
                &self.slots.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// One plugin of the chains, instantiated on its first hook.
struct Slot {
    name: Arc<str>,
    plugin: CompiledPlugin,
    settings: PluginSettings,
    call: Option<PluginCall>,
}

/// Why a chain stopped.
#[derive(Debug)]
pub enum HookFailure {
    /// The plugin refused, with its status and message.
    Rejected {
        plugin: Arc<str>,
        rejection: Rejection,
    },
    /// The plugin failed or broke a rule.
    Failed {
        plugin: Arc<str>,
        error: PluginError,
    },
    /// The plugin returned something the gateway cannot send on.
    Invalid { plugin: Arc<str>, reason: String },
    /// A chain names a plugin the tenant has not uploaded.
    NotFound {
        plugin: Arc<str>,
        tenant: Arc<str>,
        hook: &'static str,
    },
    /// The thread running the hooks died (its panic is in the gateway log).
    Lost,
}

impl Hooks {
    /// The tenant's chains with every plugin found by `lookup` (the
    /// tenant's uploaded plugins); `None` when the tenant runs no plugin.
    /// A chained plugin that is not uploaded fails the request (502
    /// `plugin_not_found`): a guard the tenant asked for never silently
    /// goes missing.
    pub fn resolve(
        tenant: &str,
        chains: &TenantPlugins,
        lookup: impl Fn(&str) -> Option<CompiledPlugin>,
        metrics: &Arc<Metrics>,
        gate: &Arc<HookGate>,
    ) -> Result<Option<Hooks>, HookFailure> {
        if chains.is_empty() {
            return Ok(None);
        }
        let mut slots: Vec<Slot> = Vec::with_capacity(chains.settings.len());
        let mut index_of = |name: &Arc<str>, hook: &'static str| -> Result<usize, HookFailure> {
            if let Some(i) = slots.iter().position(|s| s.name == *name) {
                return Ok(i);
            }
            let plugin = lookup(name).ok_or_else(|| HookFailure::NotFound {
                plugin: Arc::clone(name),
                tenant: Arc::from(tenant),
                hook,
            })?;
            slots.push(Slot {
                name: Arc::clone(name),
                plugin,
                settings: chains.settings.get(name).cloned().unwrap_or_default(),
                call: None,
            });
            Ok(slots.len() - 1)
        };
        let on_request = chains
            .on_request
            .iter()
            .map(|name| index_of(name, "on_request"))
            .collect::<Result<Vec<_>, _>>()?;
        let on_response = chains
            .on_response
            .iter()
            .map(|name| index_of(name, "on_response"))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(Hooks {
            tenant: Arc::from(tenant),
            slots,
            on_request,
            on_response,
            metrics: Arc::clone(metrics),
            gate: Arc::clone(gate),
            parent: tracing::Span::current(),
        }))
    }

    /// Whether requests pass through plugins.
    pub fn has_request_chain(&self) -> bool {
        !self.on_request.is_empty()
    }

    /// Whether responses pass through plugins.
    pub fn has_response_chain(&self) -> bool {
        !self.on_response.is_empty()
    }

    /// Runs `f` on one of the gate's hook threads (hooks are synchronous
    /// and run up to their deadline) once the gate lets it, and hands the
    /// hooks back. The pass goes along: the slot is held until `f`
    /// returns, also when the request is dropped meanwhile.
    async fn blocking<T: Send + 'static>(
        mut self,
        f: impl FnOnce(&mut Hooks) -> T + Send + 'static,
    ) -> Result<(Hooks, T), HookFailure> {
        let queued = Instant::now();
        let gate = Arc::clone(&self.gate);
        let pass = gate.enter(&self.tenant).await;
        self.metrics
            .plugin_gate_wait
            .get_or_create(&TenantLabels {
                tenant: self.tenant.to_string(),
            })
            .observe(queued.elapsed().as_secs_f64());
        let (sender, receiver) = tokio::sync::oneshot::channel();
        gate.spawn(pass, move || {
            let out = f(&mut self);
            // The request may be gone; then so is what it would have got.
            let _ = sender.send((self, out));
        });
        receiver.await.map_err(|_| HookFailure::Lost)
    }

    /// The `on-request` chain over `request`, each rewrite checked against
    /// the request rules and the tenant's policy before the next plugin
    /// sees it.
    pub async fn on_request(
        self,
        request: InferenceRequest,
        tenant: Arc<TenantRules>,
        request_id: String,
    ) -> Result<(Hooks, InferenceRequest), HookFailure> {
        if self.on_request.is_empty() {
            return Ok((self, request));
        }
        let (hooks, out) = self
            .blocking(move |hooks| hooks.request_chain(request, &tenant, &request_id))
            .await?;
        Ok((hooks, out?))
    }

    fn request_chain(
        &mut self,
        mut request: InferenceRequest,
        rules: &TenantRules,
        request_id: &str,
    ) -> Result<InferenceRequest, HookFailure> {
        let mut metadata = vec![
            ("tenant".to_string(), self.tenant.to_string()),
            ("endpoint".to_string(), request.endpoint.name().to_string()),
            ("request-id".to_string(), request_id.to_string()),
            ("stream".to_string(), request.stream.to_string()),
        ];
        for i in self.on_request.clone() {
            let view = to_plugin(&request, std::mem::take(&mut metadata));
            let rewritten = self.call(i, Hook::OnRequest, |call| call.on_request(view))?;
            let plugin = &self.slots[i].name;
            metadata =
                apply(&mut request, rewritten, rules).map_err(|reason| HookFailure::Invalid {
                    plugin: Arc::clone(plugin),
                    reason,
                })?;
        }
        if !metadata.is_empty() {
            tracing::debug!(tenant = %self.tenant, request_id, ?metadata, "plugin metadata");
        }
        Ok(request)
    }

    /// The `on-response` chain over a whole response's text and finish
    /// reason. Token counts and the model are the gateway's: plugins see
    /// them, changes to them are ignored.
    pub async fn on_response(
        self,
        response: plugins::Response,
    ) -> Result<(Hooks, (String, Finish)), HookFailure> {
        let (hooks, out) = self
            .blocking(move |hooks| hooks.response_chain(response))
            .await?;
        Ok((hooks, out?))
    }

    fn response_chain(
        &mut self,
        mut response: plugins::Response,
    ) -> Result<(String, Finish), HookFailure> {
        let mut finish = parse_finish(&response.finish_reason).unwrap_or(Finish::Stop);
        for i in self.on_response.clone() {
            // Only text and finish_reason are the plugin's to change.
            let (model, prompt_tokens, completion_tokens) = (
                response.model.clone(),
                response.prompt_tokens,
                response.completion_tokens,
            );
            let out = self.call(i, Hook::OnResponse, |call| call.on_response(response))?;
            finish = parse_finish(&out.finish_reason).ok_or_else(|| HookFailure::Invalid {
                plugin: Arc::clone(&self.slots[i].name),
                reason: format!(
                    "returned finish_reason `{}`; it must be `stop`, `length` or `content_filter`",
                    out.finish_reason.escape_debug()
                ),
            })?;
            response = plugins::Response {
                model,
                text: out.text,
                finish_reason: out.finish_reason,
                prompt_tokens,
                completion_tokens,
            };
        }
        Ok((response.text, finish))
    }

    /// One streamed delta through the `on-chunk` chain: what to send now
    /// (possibly empty).
    pub async fn on_chunk(self, text: String) -> Result<(Hooks, String), HookFailure> {
        let (hooks, out) = self.blocking(move |hooks| hooks.chunk_chain(text)).await?;
        Ok((hooks, out?))
    }

    fn chunk_chain(&mut self, mut text: String) -> Result<String, HookFailure> {
        for i in self.on_response.clone() {
            if text.is_empty() {
                break;
            }
            text = self.call(i, Hook::OnChunk, |call| call.on_chunk(&text))?;
        }
        Ok(text)
    }

    /// The end of a stream: each plugin's held-back text, passed through
    /// the `on-chunk` of the plugins after it before their own
    /// `on-stream-end`.
    pub async fn on_stream_end(self) -> Result<(Hooks, String), HookFailure> {
        let (hooks, out) = self.blocking(|hooks| hooks.end_chain()).await?;
        Ok((hooks, out?))
    }

    fn end_chain(&mut self) -> Result<String, HookFailure> {
        let mut text = String::new();
        for i in self.on_response.clone() {
            if !text.is_empty() {
                text = self.call(i, Hook::OnChunk, |call| call.on_chunk(&text))?;
            }
            let tail = self.call(i, Hook::OnStreamEnd, PluginCall::on_stream_end)?;
            text.push_str(&tail);
        }
        Ok(text)
    }

    /// Runs one hook of slot `i` (instantiating it first if needed),
    /// counting the result and the time.
    fn call<T>(
        &mut self,
        i: usize,
        hook: Hook,
        f: impl FnOnce(&mut PluginCall) -> Result<Result<T, Rejection>, PluginError>,
    ) -> Result<T, HookFailure> {
        let started = Instant::now();
        let slot = &mut self.slots[i];
        let hook_name = hook_label(hook);
        let span = tracing::info_span!(
            target: crate::metrics::TRACE_TARGET,
            parent: &self.parent,
            "plugin",
            bulkhead.plugin.name = &*slot.name,
            bulkhead.plugin.digest = %slot.plugin.digest(),
            bulkhead.plugin.hook = hook_name,
            bulkhead.plugin.outcome = tracing::field::Empty,
            bulkhead.plugin.duration_ms = tracing::field::Empty,
        );
        let outcome = span.in_scope(|| slot.instance(&self.tenant).and_then(f));
        let result = match &outcome {
            Ok(Ok(_)) => "ok",
            Ok(Err(_)) => "rejected",
            Err(e) => e.code(),
        };
        span.record("bulkhead.plugin.outcome", result);
        span.record(
            "bulkhead.plugin.duration_ms",
            started.elapsed().as_secs_f64() * 1e3,
        );
        self.metrics
            .plugin_duration
            .get_or_create(&HookLabels {
                tenant: self.tenant.to_string(),
                hook: hook_name,
            })
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .plugin_calls
            .get_or_create(&PluginCallLabels {
                tenant: self.tenant.to_string(),
                plugin: slot.name.to_string(),
                hook: hook_name,
                result,
            })
            .inc();
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(rejection)) => Err(HookFailure::Rejected {
                plugin: Arc::clone(&slot.name),
                rejection,
            }),
            Err(error) => {
                tracing::warn!(tenant = %self.tenant, plugin = %slot.name, code = error.code(), "{error}");
                Err(HookFailure::Failed {
                    plugin: Arc::clone(&slot.name),
                    error,
                })
            }
        }
    }
}

impl Slot {
    fn instance(&mut self, tenant: &Arc<str>) -> Result<&mut PluginCall, PluginError> {
        if self.call.is_none() {
            let call = self.plugin.instantiate(CallContext {
                tenant: Arc::clone(tenant),
                plugin: Arc::clone(&self.name),
                config: Arc::clone(&self.settings.config),
                limits: self.settings.limits.clone(),
            })?;
            self.call = Some(call);
        }
        // Set just above.
        Ok(self.call.as_mut().expect("instantiated"))
    }
}

fn hook_label(hook: Hook) -> &'static str {
    match hook {
        Hook::Instantiate => "instantiate",
        Hook::OnRequest => "on-request",
        Hook::OnResponse => "on-response",
        Hook::OnChunk => "on-chunk",
        Hook::OnStreamEnd => "on-stream-end",
    }
}

fn parse_finish(reason: &str) -> Option<Finish> {
    match reason {
        "stop" => Some(Finish::Stop),
        "length" => Some(Finish::Length),
        "content_filter" => Some(Finish::ContentFilter),
        _ => None,
    }
}

/// What a rewritten request is checked against: the tenant's models and
/// `max_tokens` cap.
#[derive(Debug)]
pub struct TenantRules {
    /// `None`: any model (`bulkhead plugin run`, which has no tenant).
    pub models: Option<std::collections::BTreeSet<String>>,
    pub max_tokens: u32,
}

impl TenantRules {
    pub fn of(tenant: &TenantPolicy) -> TenantRules {
        TenantRules {
            models: Some(tenant.models.clone()),
            max_tokens: tenant.limits.max_tokens,
        }
    }
}

/// The plugin's view of a request.
pub fn to_plugin(request: &InferenceRequest, metadata: Vec<(String, String)>) -> plugins::Request {
    let prompt = match &request.prompt {
        Prompt::Chat(messages) => plugins::Prompt::Chat(
            messages
                .iter()
                .map(|(role, content)| plugins::Message {
                    role: role.clone(),
                    content: content.clone(),
                })
                .collect(),
        ),
        Prompt::Text(text) => plugins::Prompt::Text(text.clone()),
        Prompt::Tokens(ids) => plugins::Prompt::Tokens(ids.clone()),
    };
    plugins::Request {
        model: request.model.clone(),
        prompt,
        sampling: plugins::Sampling {
            max_tokens: request.max_tokens,
            temperature: request.temperature,
            top_p: request.top_p,
            seed: request.seed,
            stop: request.stop.clone(),
        },
        metadata,
    }
}

/// Takes a plugin's rewrite of `request` after checking it by the same
/// rules a client's request meets (and the tenant's models and
/// `max_tokens`); `Err` says what is wrong, for a `plugin_invalid_output`
/// error. On `Err`, `request` is unchanged.
pub fn apply(
    request: &mut InferenceRequest,
    rewritten: plugins::Request,
    rules: &TenantRules,
) -> Result<Vec<(String, String)>, String> {
    let plugins::Request {
        model,
        prompt,
        sampling,
        metadata,
    } = rewritten;
    if model.is_empty() || rules.models.as_ref().is_some_and(|m| !m.contains(&model)) {
        return Err(format!(
            "chose model `{}`, which this tenant may not use",
            model.escape_debug()
        ));
    }
    let prompt = match (&request.prompt, prompt) {
        (Prompt::Chat(_), plugins::Prompt::Chat(messages)) => {
            if messages.is_empty() || messages.len() > MAX_MESSAGES {
                return Err(format!(
                    "returned {} chat messages; a request holds 1 to {MAX_MESSAGES}",
                    messages.len()
                ));
            }
            let mut out = Vec::with_capacity(messages.len());
            for m in messages {
                if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                    return Err(format!(
                        "returned a message with role `{}`; roles are system, user and assistant",
                        m.role.escape_debug()
                    ));
                }
                out.push((m.role, m.content));
            }
            Prompt::Chat(out)
        }
        (Prompt::Text(_), plugins::Prompt::Text(text)) => Prompt::Text(text),
        (Prompt::Tokens(_), plugins::Prompt::Tokens(ids)) => {
            if ids.is_empty() {
                return Err("returned an empty token prompt".to_string());
            }
            Prompt::Tokens(ids)
        }
        (before, _) => {
            return Err(format!(
                "changed the prompt's kind (it was {}); a plugin may rewrite a prompt, not \
                 turn it into another kind",
                match before {
                    Prompt::Chat(_) => "chat messages",
                    Prompt::Text(_) => "text",
                    Prompt::Tokens(_) => "token ids",
                }
            ));
        }
    };
    match sampling.max_tokens {
        Some(0) => return Err("set max_tokens to 0".to_string()),
        Some(n) if n > rules.max_tokens => {
            return Err(format!(
                "set max_tokens to {n}; this tenant may ask for at most {}",
                rules.max_tokens
            ));
        }
        _ => {}
    }
    if !(0.0..=2.0).contains(&sampling.temperature) {
        return Err(format!(
            "set temperature to {}; it must be from 0 to 2",
            sampling.temperature
        ));
    }
    if !(sampling.top_p > 0.0 && sampling.top_p <= 1.0) {
        return Err(format!(
            "set top_p to {}; it must be above 0 and at most 1",
            sampling.top_p
        ));
    }
    if sampling.stop.len() > MAX_STOP
        || sampling
            .stop
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(format!(
            "returned {} stop sequences; at most {MAX_STOP}, each 1 to {MAX_STOP_BYTES} bytes",
            sampling.stop.len()
        ));
    }
    request.model = model;
    request.prompt = prompt;
    request.max_tokens = sampling.max_tokens;
    request.temperature = sampling.temperature;
    request.top_p = sampling.top_p;
    request.seed = sampling.seed;
    request.stop = sampling.stop;
    Ok(metadata)
}

/// The effective `max_tokens` of a request after the chain: as asked, or
/// the endpoint's default capped by the tenant.
pub fn effective_max_tokens(request: &InferenceRequest, tenant_max: u32) -> u32 {
    match request.max_tokens {
        Some(n) => n.min(tenant_max),
        None => match request.endpoint {
            Endpoint::Chat => tenant_max,
            Endpoint::Completion => COMPLETIONS_DEFAULT_MAX_TOKENS.min(tenant_max),
        },
    }
}

#[cfg(test)]
mod tests;
