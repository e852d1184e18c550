//! The table's own rules. What the routers really serve, on the real
//! binary, is checked by `tests/e2e/gateway_routes.rs`.

use std::collections::BTreeSet;

use super::*;
use crate::auth::Principal;

#[test]
fn every_route_is_declared_once() {
    let mut seen = BTreeSet::new();
    for route in ROUTES {
        assert!(
            seen.insert((route.method.as_str(), route.path, route.listener as u8)),
            "{route:?} is declared twice"
        );
    }
}

#[test]
fn listeners_and_principals_never_mix() {
    for route in ROUTES {
        match (route.listener, route.access) {
            (Listener::Public, Access::Operator(_)) => {
                panic!("{route:?}: operator route on the public listener")
            }
            (Listener::Admin, Access::Tenant(_)) => {
                panic!("{route:?}: tenant route on the admin listener")
            }
            (_, Access::Tenant(scope)) => {
                assert_eq!(scope.principal(), Principal::Tenant, "{route:?}")
            }
            (_, Access::Operator(scope)) => {
                assert_eq!(scope.principal(), Principal::Operator, "{route:?}")
            }
            (_, Access::Anonymous) => assert!(
                route.method == Method::Get
                    && ["/healthz", "/readyz", "/metrics"].contains(&route.path),
                "{route:?}: only health and metrics are anonymous"
            ),
        }
        assert_eq!(
            route.path.starts_with("/admin/"),
            route.listener == Listener::Admin && route.access != Access::Anonymous,
            "{route:?}: /admin/ paths are the operator API, on the admin listener only"
        );
        if route.path == "/metrics" {
            assert_eq!(route.listener, Listener::Admin, "metrics are for operators");
        }
    }
}

#[test]
fn every_operator_scope_guards_some_route() {
    for scope in Scope::of(Principal::Operator).chain(Scope::of(Principal::Tenant)) {
        assert!(
            ROUTES
                .iter()
                .any(|r| matches!(r.access, Access::Operator(s) | Access::Tenant(s) if s == scope)),
            "scope `{scope}` guards nothing"
        );
    }
}

/// The routers are built from the table alone: no other code in the
/// gateway adds a route, nests or merges a router.
#[test]
fn no_route_is_added_outside_the_table() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut offenders = Vec::new();
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("api/routes.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Unit tests (an inline `mod tests` ends its file) may build
            // routers of their own.
            let code = text.split("mod tests {").next().unwrap_or_default();
            for needle in [
                "Router::new",
                ".route(",
                ".nest(",
                ".merge(",
                ".route_service(",
            ] {
                // This file names the needles itself.
                if code.contains(needle) && !path.ends_with("api/routes/tests.rs") {
                    offenders.push(format!("{} uses {needle}", path.display()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "routes outside api/routes.rs: {offenders:?}"
    );
}
