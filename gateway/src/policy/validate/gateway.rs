//! `gateway.toml`'s checks: listeners, connections, the admin API,
//! plugins, audit, the model registry, the upstream gpu-host (TLS and
//! secrets) and the local one.

use super::secrets::{MAX_TLS_FILE_BYTES, read_capped_file, read_secret};
use super::*;

/// `gateway.toml` resolved, plus what the other files are checked against.
pub(super) struct Gateway {
    pub(super) settings: GatewaySettings,
    /// Models tenants may name; `None` when any valid name may be (models
    /// registered through the API are not known here, or gateway.toml
    /// itself is broken).
    pub(super) served_models: Option<BTreeSet<String>>,
    /// The configured models that verified.
    pub(super) models: Vec<Arc<Registration>>,
    /// The body size no tenant may exceed; `None` when gateway.toml is broken.
    pub(super) body_cap: Option<u64>,
    /// Limits of a tenant and class that set none.
    pub(super) default_limits: Limits,
    /// The local gpu-host's device and model reservation, when gateway.toml
    /// parsed and they checked; `None` with a remote upstream.
    pub(super) device: Option<(bulkhead_partition::Device, u64)>,
    /// `[operator]`.
    pub(super) operator: OperatorPolicy,
}

pub(super) fn check_gateway(
    dir: &Path,
    parsed: Option<&Parsed<GatewayFile>>,
    trust: &Trust,
    errors: &mut Vec<PolicyError>,
) -> Gateway {
    let blank = SourceFile::new("gateway.toml", "");
    let defaults = GatewayFile::default();
    let source = parsed.map_or(&blank, |p| &p.source);
    // A broken gateway.toml was reported already; check the rest against
    // defaults but skip the cross-file checks that would only echo it.
    let known = parsed.is_none_or(|p| p.doc.is_some());
    let file = parsed.and_then(|p| p.doc.as_ref()).unwrap_or(&defaults);

    let default_listen: SocketAddr = DEFAULT_LISTEN
        .parse()
        .expect("DEFAULT_LISTEN is an address");
    let listen = file.listen.as_ref().map_or(default_listen, |listen| {
        listen.get_ref().parse().unwrap_or_else(|_| {
            errors.push(source.error_at(
                listen.span(),
                format!(
                    "`{}` is not a listen address: expected IP:PORT, e.g. {DEFAULT_LISTEN}",
                    listen.get_ref()
                ),
            ));
            default_listen
        })
    });
    let admin_listen = check_admin_listen(dir, source, file.admin.as_ref(), listen, errors);
    let connections = check_connections(source, file.connections.as_ref(), errors);
    let limit_store =
        super::limit_store::check_limit_store(dir, source, file.limits.as_ref(), errors);
    let operator = OperatorPolicy {
        issuers: file
            .operator
            .as_ref()
            .map(|o| o.issuers.clone())
            .unwrap_or_default(),
        source: parsed.map_or_else(
            || Arc::new(SourceFile::new("gateway.toml", "")),
            |p| Arc::clone(&p.source),
        ),
    };
    let max_body_bytes = at_least_one(source, "max_body_bytes", &file.max_body_bytes, errors)
        .unwrap_or(DEFAULT_MAX_BODY_BYTES);
    let request_timeout_ms = at_least_one(
        source,
        "request_timeout_ms",
        &file.request_timeout_ms,
        errors,
    )
    .unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS);
    let jwt_leeway_s = match &file.jwt_leeway_s {
        None => DEFAULT_JWT_LEEWAY_S,
        Some(leeway) if *leeway.get_ref() > MAX_JWT_LEEWAY_S => {
            errors.push(source.error_at(
                leeway.span(),
                format!(
                    "`jwt_leeway_s` is {}; at most {MAX_JWT_LEEWAY_S} is allowed \
                     (a long leeway keeps expired tokens usable)",
                    leeway.get_ref()
                ),
            ));
            DEFAULT_JWT_LEEWAY_S
        }
        Some(leeway) => *leeway.get_ref(),
    };

    let local_defaults = LocalGpuHostFile::default();
    let mut device = None;
    let (upstream, models) = match (&file.upstream, &file.gpu_hosts[..], &file.local_gpu_host) {
        (remote, [], None | Some(_)) if remote.is_none() => {
            let before = errors.len();
            let (local, models) = check_local(
                dir,
                source,
                file.local_gpu_host.as_ref().unwrap_or(&local_defaults),
                trust,
                errors,
            );
            if errors.len() == before {
                device = Some((local.device.clone(), local.model_reservation_bytes));
            }
            (UpstreamSettings::Local(local), models)
        }
        (upstream, hosts, local) => {
            let span = upstream
                .as_ref()
                .map_or_else(|| hosts[0].target.span(), |u| u.target.span());
            if local.is_some() {
                let remote = if upstream.is_some() {
                    "`[upstream]`"
                } else {
                    "`[[gpu_hosts]]`"
                };
                errors.push(source.error_at(
                    span.clone(),
                    format!(
                        "{remote} and `[local_gpu_host]` are both set: \
                         use a remote gpu-host or a local one, not both"
                    ),
                ));
            }
            if upstream.is_some() && !hosts.is_empty() {
                errors.push(source.error_at(
                    span,
                    "`[upstream]` and `[[gpu_hosts]]` are both set: name one host in \
                     `[upstream]`, or every host in `[[gpu_hosts]]`",
                ));
            }
            let listed: Vec<(&UpstreamFile, bool)> = match upstream {
                Some(upstream) => vec![(upstream, false)],
                None => hosts.iter().map(|h| (h, true)).collect(),
            };
            let (hosts, models) = check_remote_hosts(dir, source, &listed, trust, errors);
            (UpstreamSettings::Remote(hosts), models)
        }
    };
    // A database meant, even when its settings are broken: its errors are
    // enough, without the file stores' on top.
    let in_database = file
        .state
        .as_ref()
        .and_then(|state| state.store.as_ref())
        .is_some_and(|store| store.get_ref() != "files");
    let models_registry = check_registry(dir, source, file.models.as_ref(), errors);
    let usage_dir = file
        .usage
        .as_ref()
        .and_then(|u| u.dir.as_ref())
        .map(|usage| {
            let path = lexically_normal(&dir.join(usage.get_ref()));
            if usage.get_ref().as_os_str().is_empty() || path.starts_with(lexically_normal(dir)) {
                errors.push(source.error_at(
                    usage.span(),
                    format!(
                        "the usage folder {} must be named and outside the policy folder, which is \
                     watched for changes, e.g. \"../var/usage\"",
                        path.display()
                    ),
                ));
            }
            path
        });
    if in_database && let Some(registry) = file.models.as_ref().and_then(|m| m.registry.as_ref()) {
        errors.push(source.error_at(
            registry.span(),
            "with `[state] store = \"postgres://...\"` models registered through the API live \
             in the database: remove `registry` (`bulkhead state migrate` copies a registry \
             folder there)",
        ));
    }
    // With a registry (a folder or the database), tenants may name models
    // registered later through the API; without one, only the configured
    // models can ever be served.
    // Every configured name counts, verified or not: a model that failed
    // is reported once, where it is configured.
    let configured: Vec<&ModelFile> = match (&file.upstream, &file.local_gpu_host) {
        (Some(remote), _) => remote.models.iter().collect(),
        (None, _) if !file.gpu_hosts.is_empty() => {
            file.gpu_hosts.iter().flat_map(|h| &h.models).collect()
        }
        (None, Some(local)) => local.models.iter().collect(),
        (None, None) => local_defaults.models.iter().collect(),
    };
    let served_models = match models_registry {
        Some(_) => None,
        None if in_database => None,
        None => Some(
            configured
                .iter()
                .map(|m| m.name.get_ref().clone())
                .collect(),
        ),
    };

    if let Some(telemetry) = &file.telemetry {
        // The file alone: the variables are the running process's and are
        // checked when it starts.
        if let Err(e) =
            bulkhead_telemetry::Settings::resolve(telemetry.get_ref(), "bulkhead", |_| None)
        {
            errors.push(source.error_at(telemetry.span(), e.to_string()));
        }
    }
    let plugins = check_plugins(dir, source, file.plugins.as_ref(), errors);
    let state = super::state::check_state(dir, source, file.state.as_ref(), errors);
    let audit = file
        .audit
        .as_ref()
        .map(|audit| super::state::check_audit(dir, source, audit, in_database, errors));

    Gateway {
        settings: GatewaySettings {
            listen,
            admin_listen,
            connections,
            limit_store,
            max_body_bytes,
            request_timeout: Duration::from_millis(request_timeout_ms),
            jwt_leeway: Duration::from_secs(jwt_leeway_s),
            upstream,
            plugins,
            audit,
            state,
            models_registry,
            usage_dir,
        },
        served_models: served_models.filter(|_| known),
        models,
        body_cap: known.then_some(max_body_bytes),
        default_limits: Limits {
            max_body_bytes: Limits::DEFAULT.max_body_bytes.min(max_body_bytes),
            ..Limits::DEFAULT
        },
        device: device.filter(|_| known),
        operator,
    }
}

/// `[connections]`: every value at least 1, the per-IP cap at most the
/// total, the header timeout at most a minute, the body's at most five.
pub(super) fn check_connections(
    source: &SourceFile,
    file: Option<&ConnectionsFile>,
    errors: &mut Vec<PolicyError>,
) -> ConnectionLimits {
    let defaults = ConnectionLimits::DEFAULT;
    let Some(file) = file else {
        return defaults;
    };
    let mut timeout_ms = |key: &str, value: &Option<Spanned<u64>>, max_ms: u64| {
        let ms = at_least_one(source, key, value, errors);
        if let (Some(ms), Some(field)) = (ms, value)
            && ms > max_ms
        {
            errors.push(source.error_at(
                field.span(),
                format!(
                    "`{key}` is {ms}; at most {max_ms} (a long one lets slow clients hold \
                     connections)"
                ),
            ));
        }
        ms.map(Duration::from_millis)
    };
    let header_read_timeout = timeout_ms(
        "header_read_timeout_ms",
        &file.header_read_timeout_ms,
        60_000,
    );
    let body_read_timeout = timeout_ms("body_read_timeout_ms", &file.body_read_timeout_ms, 300_000);
    let count =
        |key, value: &Option<Spanned<u64>>, default: usize, errors: &mut Vec<PolicyError>| {
            at_least_one(source, key, value, errors)
                .map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX))
        };
    let max_connections = count(
        "max_connections",
        &file.max_connections,
        defaults.max_connections,
        errors,
    );
    let max_connections_per_ip = count(
        "max_connections_per_ip",
        &file.max_connections_per_ip,
        defaults.max_connections_per_ip.min(max_connections),
        errors,
    );
    if let Some(field) = &file.max_connections_per_ip
        && max_connections_per_ip > max_connections
    {
        errors.push(source.error_at(
            field.span(),
            format!(
                "`max_connections_per_ip` is {max_connections_per_ip}, more than \
                 `max_connections` ({max_connections})"
            ),
        ));
    }
    let streams = at_least_one(
        source,
        "http2_max_concurrent_streams",
        &file.http2_max_concurrent_streams,
        errors,
    );
    ConnectionLimits {
        header_read_timeout: header_read_timeout.unwrap_or(defaults.header_read_timeout),
        body_read_timeout: body_read_timeout.unwrap_or(defaults.body_read_timeout),
        max_connections,
        max_connections_per_ip,
        http2_max_concurrent_streams: streams.unwrap_or(defaults.http2_max_concurrent_streams),
    }
}

/// `[admin] listen`: `HOST:PORT` or `unix:PATH` (relative to the policy
/// folder unless absolute), never the tenants' address.
pub(super) fn check_admin_listen(
    dir: &Path,
    source: &SourceFile,
    admin: Option<&AdminFile>,
    public: SocketAddr,
    errors: &mut Vec<PolicyError>,
) -> ListenAddr {
    let default = ListenAddr::Tcp(
        DEFAULT_ADMIN_LISTEN
            .parse()
            .expect("DEFAULT_ADMIN_LISTEN is an address"),
    );
    let Some(listen) = admin.and_then(|a| a.listen.as_ref()) else {
        return default;
    };
    let addr = match ListenAddr::parse(listen.get_ref()) {
        Ok(ListenAddr::Unix(path)) => ListenAddr::Unix(lexically_normal(&dir.join(path))),
        Ok(addr) => addr,
        Err(reason) => {
            errors.push(source.error_at(listen.span(), reason));
            return default;
        }
    };
    if let ListenAddr::Tcp(tcp) = &addr
        && tcp.port() != 0
        && *tcp == public
    {
        errors.push(source.error_at(
            listen.span(),
            format!(
                "the admin listener `{tcp}` is the tenants' `listen` address: the operator API \
                 needs a listener of its own"
            ),
        ));
    }
    addr
}

/// `[plugins]`: the store folder, resolved against the policy folder. It
/// must lie outside it: the policy folder is watched, and every store write
/// would wake a reload.
pub(super) fn check_plugins(
    dir: &Path,
    source: &SourceFile,
    plugins: Option<&PluginsGatewayFile>,
    errors: &mut Vec<PolicyError>,
) -> GatewayPlugins {
    let maximums = match plugins.and_then(|p| p.maximums.as_ref()) {
        Some(file) => super::super::plugins::check_maximums(source, file, errors),
        None => super::super::plugins::ceilings(),
    };
    let max_concurrent_calls = match plugins.and_then(|p| p.max_concurrent_calls.as_ref()) {
        None => crate::plugins::default_gate_slots(),
        Some(calls) => {
            let n = *calls.get_ref();
            match usize::try_from(n) {
                Ok(n @ 1..=crate::plugins::MAX_GATE_SLOTS) => n,
                _ => {
                    errors.push(source.error_at(
                        calls.span(),
                        format!(
                            "`max_concurrent_calls` is {n}; it must be from 1 to {} (the \
                             default, {}, leaves one of this machine's cores to the request path)",
                            crate::plugins::MAX_GATE_SLOTS,
                            crate::plugins::default_gate_slots()
                        ),
                    ));
                    crate::plugins::default_gate_slots()
                }
            }
        }
    };
    let Some(store) = plugins.and_then(|p| p.store.as_ref()) else {
        return GatewayPlugins {
            store: None,
            maximums,
            max_concurrent_calls,
        };
    };
    let path = lexically_normal(&dir.join(store.get_ref()));
    if store.get_ref().as_os_str().is_empty() {
        errors.push(source.error_at(
            store.span(),
            "`store` is empty: name a folder for the plugin store, e.g. \"../var/plugins\"",
        ));
    } else if path.starts_with(lexically_normal(dir)) {
        errors.push(source.error_at(
            store.span(),
            format!(
                "the plugin store {} is inside the policy folder, which is watched for \
                 changes: put it outside, e.g. \"../var/plugins\"",
                path.display()
            ),
        ));
    }
    GatewayPlugins {
        store: Some(path),
        maximums,
        max_concurrent_calls,
    }
}

/// `[models] registry`: the folder API registrations are kept in, outside
/// the watched policy folder (like the plugin store).
pub(super) fn check_registry(
    dir: &Path,
    source: &SourceFile,
    models: Option<&ModelsGatewayFile>,
    errors: &mut Vec<PolicyError>,
) -> Option<PathBuf> {
    let registry = models?.registry.as_ref()?;
    let path = lexically_normal(&dir.join(registry.get_ref()));
    if registry.get_ref().as_os_str().is_empty() {
        errors.push(source.error_at(
            registry.span(),
            "`registry` is empty: name a folder for registered models, e.g. \"../var/models\"",
        ));
    } else if path.starts_with(lexically_normal(dir)) {
        errors.push(source.error_at(
            registry.span(),
            format!(
                "the model registry {} is inside the policy folder, which is watched for \
                 changes: put it outside, e.g. \"../var/models\"",
                path.display()
            ),
        ));
    }
    Some(path)
}

/// `[upstream]` or every `[[gpu_hosts]]` (`named`: a name is required):
/// each host resolved, and the union of their models. A model configured
/// on several hosts must be the same signed weights on each.
fn check_remote_hosts(
    dir: &Path,
    source: &SourceFile,
    hosts: &[(&UpstreamFile, bool)],
    trust: &Trust,
    errors: &mut Vec<PolicyError>,
) -> (Vec<RemoteHost>, Vec<Arc<Registration>>) {
    if hosts.len() > MAX_GPU_HOSTS {
        errors.push(source.error(format!(
            "{} `[[gpu_hosts]]` are configured; at most {MAX_GPU_HOSTS} may be",
            hosts.len()
        )));
        return (Vec::new(), Vec::new());
    }
    let mut resolved = Vec::new();
    let mut models: Vec<Arc<Registration>> = Vec::new();
    let mut where_from: BTreeMap<String, String> = BTreeMap::new();
    for &(file, named) in hosts {
        let name = match (&file.name, named) {
            (Some(name), _) if !valid_model_name(name.get_ref()) => {
                errors.push(source.error_at(
                    name.span(),
                    format!(
                        "gpu-host name `{}` is not valid: {MODEL_NAME_RULE}",
                        name.get_ref().escape_debug()
                    ),
                ));
                continue;
            }
            (Some(name), true) => name.get_ref().clone(),
            (Some(name), false) => {
                errors.push(source.error_at(
                    name.span(),
                    "`[upstream]` takes no `name` (it is `upstream`); several named hosts go \
                     in `[[gpu_hosts]]`",
                ));
                continue;
            }
            (None, true) => {
                errors.push(source.error_at(
                    file.target.span(),
                    "every `[[gpu_hosts]]` needs a `name` (used by the admin API, logs and \
                     metrics)",
                ));
                continue;
            }
            (None, false) => "upstream".to_string(),
        };
        if resolved.iter().any(|h: &RemoteHost| h.name == name) {
            errors.push(source.error_at(
                file.name.as_ref().map_or(file.target.span(), |n| n.span()),
                format!("gpu-host `{name}` is named twice"),
            ));
            continue;
        }
        let mut host = check_upstream(dir, source, file, name, errors);
        for model in check_models(dir, source, &file.models, trust, HostKind::Remote, errors) {
            host.models.insert(model.name.clone());
            match models.iter().find(|m| m.name == model.name) {
                Some(first) if first.digest != model.digest => {
                    let span = file
                        .models
                        .iter()
                        .find(|m| *m.name.get_ref() == model.name)
                        .map_or(file.target.span(), |m| m.name.span());
                    errors.push(source.error_at(
                        span,
                        format!(
                            "model `{}` on gpu-host `{}` is other weights ({}) than on `{}` \
                             ({}): one name must be the same model on every host",
                            model.name,
                            host.name,
                            model.digest,
                            where_from[&model.name],
                            first.digest
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    where_from.insert(model.name.clone(), host.name.clone());
                    models.push(model);
                }
            }
        }
        resolved.push(host);
    }
    (resolved, models)
}

/// One remote host's connection (its models are added by the caller).
pub(super) fn check_upstream(
    dir: &Path,
    source: &SourceFile,
    upstream: &UpstreamFile,
    name: String,
    errors: &mut Vec<PolicyError>,
) -> RemoteHost {
    let written = upstream.target.get_ref();
    let target = written.parse::<Target>().unwrap_or_else(|_| {
        errors.push(source.error_at(
            upstream.target.span(),
            format!("`{written}` is not an upstream target: expected unix:PATH, tcp:IP:PORT or tcp:NAME:PORT"),
        ));
        Target::Unix(PathBuf::new()) // stand-in; the error discards it
    });
    if target.is_tcp() && upstream.secret_file.is_none() {
        errors.push(source.error_at(
            upstream.target.span(),
            "a `tcp:` upstream needs `secret_file`: the gpu-host refuses TCP clients \
             without its bearer secret",
        ));
    }
    let secret = upstream
        .secret_file
        .as_ref()
        .and_then(|file| read_secret(dir, source, file, errors));
    let tls = check_upstream_tls(dir, source, upstream, &target, errors);
    RemoteHost {
        name,
        target,
        secret,
        tls,
        models: BTreeSet::new(),
    }
}

/// `[upstream]`'s TLS: required for `tcp:` unless `allow_plaintext`; the
/// files read and parsed as a connection would (so a bad certificate is a
/// policy error, not a failed first request).
pub(super) fn check_upstream_tls(
    dir: &Path,
    source: &SourceFile,
    upstream: &UpstreamFile,
    target: &Target,
    errors: &mut Vec<PolicyError>,
) -> Option<ClientTls> {
    let plaintext = upstream
        .allow_plaintext
        .as_ref()
        .is_some_and(|p| *p.get_ref());
    let tls_keys = [&upstream.tls_ca, &upstream.tls_cert, &upstream.tls_key];
    let any_tls = tls_keys.iter().any(|k| k.is_some()) || upstream.tls_server_name.is_some();
    if matches!(target, Target::Unix(_)) {
        if any_tls {
            errors.push(source.error_at(
                upstream.target.span(),
                "TLS settings are for a `tcp:` upstream; a unix: socket is reached without TLS",
            ));
        }
        return None;
    }
    if plaintext {
        if any_tls {
            errors.push(source.error_at(
                upstream.target.span(),
                "`allow_plaintext = true` and TLS settings together: choose one",
            ));
        }
        return None;
    }
    let Some(ca) = &upstream.tls_ca else {
        errors.push(source.error_at(
            upstream.target.span(),
            "a `tcp:` upstream needs TLS (`tls_ca`, and `tls_cert` + `tls_key` when the host \
             asks for a client certificate), or `allow_plaintext = true` to send the secret \
             and prompts in the clear",
        ));
        return None;
    };
    let mut read = |file: &Spanned<PathBuf>, what: &str| -> Option<Vec<u8>> {
        let path = dir.join(file.get_ref());
        match read_capped_file(&path, MAX_TLS_FILE_BYTES) {
            Ok(bytes) => Some(bytes),
            Err(why) => {
                errors.push(
                    source.error_at(file.span(), format!("{what} {}: {why}", path.display())),
                );
                None
            }
        }
    };
    let ca_pem = read(ca, "TLS CA")?;
    let identity = match (&upstream.tls_cert, &upstream.tls_key) {
        (Some(cert), Some(key)) => Some((read(cert, "TLS certificate")?, read(key, "TLS key")?)),
        (None, None) => None,
        (Some(field), None) | (None, Some(field)) => {
            errors.push(source.error_at(
                field.span(),
                "`tls_cert` and `tls_key` go together (the gateway's client certificate)",
            ));
            return None;
        }
    };
    let tls = ClientTls {
        ca_pem,
        identity,
        server_name: upstream
            .tls_server_name
            .as_ref()
            .map(|n| n.get_ref().clone()),
    };
    if let Err(e) = tls.check() {
        errors.push(source.error_at(ca.span(), format!("the upstream's TLS files: {e}")));
        return None;
    }
    Some(tls)
}

pub(super) fn check_local(
    dir: &Path,
    source: &SourceFile,
    local: &LocalGpuHostFile,
    trust: &Trust,
    errors: &mut Vec<PolicyError>,
) -> (LocalGpuHost, Vec<Arc<Registration>>) {
    let binary = local.binary.as_ref().map(|binary| {
        let path = dir.join(binary.get_ref());
        if let Err(why) = check_readable_file(&path) {
            errors.push(source.error_at(
                binary.span(),
                format!("gpu-host binary {}: {why}", path.display()),
            ));
        }
        path
    });
    let threads = at_least_one(source, "threads", &local.threads, errors);
    let workers =
        at_least_one(source, "workers", &local.workers, errors).unwrap_or(DEFAULT_WORKERS);
    let queue_capacity = at_least_one(source, "queue_capacity", &local.queue_capacity, errors)
        .unwrap_or(DEFAULT_QUEUE_CAPACITY);
    let restart_backoff_max_ms = at_least_one(
        source,
        "restart_backoff_max_ms",
        &local.restart_backoff_max_ms,
        errors,
    )
    .unwrap_or(DEFAULT_RESTART_BACKOFF_MAX_MS);
    let models = check_models(dir, source, &local.models, trust, HostKind::Local, errors);
    // Weights are loaded once, as large as the signed files.
    let model_bytes = models
        .iter()
        .map(|m| {
            m.file
                .size
                .or_else(|| fs::metadata(m.path()).ok().map(|meta| meta.len()))
                .unwrap_or(0)
        })
        .sum();
    let (device, model_reservation_bytes) =
        super::super::gpu::check_device(source, local, threads, model_bytes, errors);
    let host = LocalGpuHost {
        binary,
        threads,
        workers,
        queue_capacity,
        restart_backoff_max: Duration::from_millis(restart_backoff_max_ms),
        scrub_bytes_per_s: local.scrub_bytes_per_s.as_ref().map(|v| *v.get_ref()),
        scrub_min_bytes_per_s: check_scrub_floor(source, local, errors),
        device,
        model_reservation_bytes,
    };
    (host, models)
}

/// The gpu-host's default scrub rate (`--scrub-bytes-per-s`), which a floor
/// given without a rate is checked against.
pub(super) const DEFAULT_SCRUB_BYTES_PER_S: u64 = 64 << 20;

/// `scrub_min_bytes_per_s`, which may not exceed the scrub's rate (the
/// child would refuse to start).
pub(super) fn check_scrub_floor(
    source: &SourceFile,
    local: &LocalGpuHostFile,
    errors: &mut Vec<PolicyError>,
) -> Option<u64> {
    let floor = local.scrub_min_bytes_per_s.as_ref()?;
    let rate = local
        .scrub_bytes_per_s
        .as_ref()
        .map_or(DEFAULT_SCRUB_BYTES_PER_S, |v| *v.get_ref());
    if *floor.get_ref() > rate {
        errors.push(source.error_at(
            floor.span(),
            format!(
                "`scrub_min_bytes_per_s` is {}, above the scrub's rate of {rate} bytes/s \
                 (`scrub_bytes_per_s`); the floor kept at normal priority cannot exceed it",
                floor.get_ref()
            ),
        ));
    }
    Some(*floor.get_ref())
}

/// Ok if `path` is a regular file (after symlinks) this process can open.
pub(super) fn check_readable_file(path: &Path) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| io_reason(&e))?;
    if !meta.is_file() {
        return Err("is not a regular file".to_string());
    }
    fs::File::open(path).map_err(|e| io_reason(&e))?;
    Ok(())
}
