//! tidy: the structural invariants ARCHITECTURE.md states, read from the
//! sources. Each failure names the file, the line and the rule it breaks.
//!
//! - Layers: a module never imports what sits above it (the rules below).
//! - No import circle between the modules of one crate, at any folder
//!   level (a parent naming its own children does not count: it contains
//!   them).
//! - No source file over 800 lines outside tests and generated code.
//! - ARCHITECTURE.md at most 20 KB, README.md at most 16 KB, and every
//!   relative link in them and in docs/ lands on a file in the repository.
//!
//! Test modules (`tests.rs`, `tests/`, `#[cfg(test)] mod`) may reach
//! anywhere and are not read for layers or circles.

mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use source::{Crate, ModPath, Target};

/// The crates tidy reads: name, `src` folder relative to the repository.
const CRATES: [(&str, &str); 12] = [
    ("bulkhead-gateway", "gateway/src"),
    ("bulkhead-audit", "audit/src"),
    ("bulkhead-durable", "durable/src"),
    ("bulkhead-model-signing", "model-signing/src"),
    ("bulkhead-plugin-host", "plugin-host/src"),
    ("bulkhead-gpu-host", "gpu-host/src"),
    ("bulkhead-kernels", "kernels/src"),
    ("bulkhead-partition", "partition/src"),
    ("bulkhead-protocol", "protocol/src"),
    ("bulkhead-hip-sys", "gpu-host/hip-sys/src"),
    ("bulkhead-testkit", "tests/testkit/src"),
    ("bulkhead-guest", "guest-sdk/sdk/src"),
];

/// Generated code (bindgen's output), exempt from the size rule.
const GENERATED: [&str; 1] = ["gpu-host/hip-sys/src/pregenerated.rs"];

const MAX_FILE_LINES: usize = 800;
const MAX_ARCHITECTURE_BYTES: u64 = 20 * 1024;
const MAX_README_BYTES: u64 = 16 * 1024;

/// `from` (a module prefix) must never import `to`.
struct Forbid {
    krate: &'static str,
    from: &'static [&'static str],
    to: To,
    why: &'static str,
}

enum To {
    Module(&'static str),
    Crate(&'static str),
}

fn rules() -> Vec<Forbid> {
    let mut rules = Vec::new();
    let mut forbid = |krate, from: &'static [&'static str], to, why| {
        for f in from {
            rules.push(Forbid {
                krate,
                from: std::slice::from_ref(f),
                to: clone_to(&to),
                why,
            });
        }
    };
    let host = "bulkhead-gpu-host";
    for above in ["sched", "server", "models"] {
        forbid(
            host,
            &["engine"],
            To::Module(above),
            "the model runtime knows no tenants, queues or transport",
        );
        forbid(
            host,
            &["backend"],
            To::Module(above),
            "a backend runs ops; it knows no tenants, queues or transport",
        );
    }
    forbid(
        host,
        &["backend"],
        To::Module("engine"),
        "backends sit below the engine that calls them",
    );
    forbid(
        host,
        &["sched"],
        To::Module("server"),
        "the scheduler is below the gRPC transport",
    );
    for wire in ["tonic", "bulkhead_protocol", "prost"] {
        forbid(
            host,
            &["sched", "engine", "backend"],
            To::Crate(wire),
            "only the transport (server/) speaks gRPC; below it, domain types",
        );
    }
    for above in ["backend", "engine", "sched", "server", "models"] {
        forbid(
            host,
            &["hip"],
            To::Module(above),
            "the HIP runtime layer is a leaf",
        );
        forbid(
            host,
            &["cuda"],
            To::Module(above),
            "the CUDA driver layer is a leaf",
        );
    }
    let gateway = "bulkhead-gateway";
    for wire in ["tonic", "bulkhead_protocol", "prost"] {
        forbid(
            gateway,
            &["api"],
            To::Crate(wire),
            "the HTTP layer parses and encodes only; gRPC lives in upstream/",
        );
    }
    forbid(
        gateway,
        &["auth", "limits", "registration", "upstream"],
        To::Module("policy"),
        "subsystems own their config types and policy imports them, never the reverse",
    );
    forbid(
        gateway,
        &["reconcile"],
        To::Module("pool"),
        "the host pool picks hosts from what the reconciler publishes, never the reverse",
    );
    for above in ["api", "app", "pool", "reconcile", "serving", "snapshot"] {
        forbid(
            gateway,
            &[
                "auth",
                "limits",
                "registration",
                "upstream",
                "policy",
                "source",
                "pipeline",
                "request",
            ],
            To::Module(above),
            "subsystems, policy and the plugin pipeline sit below the snapshot, the reconciler and the HTTP layer",
        );
    }
    rules
}

fn clone_to(to: &To) -> To {
    match to {
        To::Module(m) => To::Module(m),
        To::Crate(c) => To::Crate(c),
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rel(path: &Path) -> String {
    let root = repo().canonicalize().expect("repository root");
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.strip_prefix(&root)
        .unwrap_or(&path)
        .display()
        .to_string()
}

/// Broken invariants, each under a key that stays put while its line moves.
#[derive(Default)]
struct Findings(BTreeMap<String, String>);

impl Findings {
    fn add(&mut self, key: String, text: String) {
        let entry = self.0.entry(key).or_default();
        entry.push_str(&text);
        if !text.ends_with('\n') {
            entry.push('\n');
        }
    }
}

#[test]
fn tidy() {
    let mut findings = Findings::default();
    let crates: Vec<Crate> = CRATES
        .iter()
        .map(|(name, src)| Crate::read(name, &repo().join(src)))
        .collect();
    for krate in &crates {
        layers(krate, &mut findings);
        circles(krate, &mut findings);
        sizes(krate, &mut findings);
    }
    docs(&mut findings);
    let failures: String = findings.0.values().map(String::as_str).collect();
    assert!(
        failures.is_empty(),
        "tidy found broken structural invariants:\n{failures}"
    );
}

fn layers(krate: &Crate, findings: &mut Findings) {
    let modules = krate.modules();
    let rules: Vec<Forbid> = rules()
        .into_iter()
        .filter(|r| r.krate == krate.name)
        .collect();
    let mut seen = BTreeSet::new();
    for file in &krate.files {
        if krate.is_test(&file.module) {
            continue;
        }
        for reference in krate.references(file) {
            for (n, rule) in rules.iter().enumerate() {
                if !starts_with(&file.module, rule.from) {
                    continue;
                }
                let hit = match (&reference.target, &rule.to) {
                    (Target::Internal(path), To::Module(m)) => {
                        let target = krate.module_of(path, &modules);
                        target.first().is_some_and(|t| t == m)
                    }
                    (Target::External(name), To::Crate(c)) => name == c,
                    _ => false,
                };
                if hit && seen.insert((file.path.clone(), reference.line, n)) {
                    let to = match rule.to {
                        To::Module(m) => format!("crate::{m}"),
                        To::Crate(c) => c.to_string(),
                    };
                    let from = rule.from.join("::");
                    let path = rel(&file.path);
                    findings.add(
                        format!("{path}: layers: `{from}` must not import `{to}`"),
                        format!(
                            "{path}:{}: layers: `{from}` must not import `{to}` ({})",
                            reference.line, rule.why
                        ),
                    );
                }
            }
        }
    }
}

fn starts_with(module: &[String], prefix: &[&str]) -> bool {
    module.len() >= prefix.len() && module.iter().zip(prefix).all(|(a, b)| a == b)
}

/// An import edge between two sibling modules, with where it was written.
type Edges = BTreeMap<(String, String), (PathBuf, usize)>;

fn circles(krate: &Crate, findings: &mut Findings) {
    let modules = krate.modules();
    // Edges grouped by the parent whose children they connect.
    let mut levels: BTreeMap<ModPath, Edges> = BTreeMap::new();
    for file in &krate.files {
        if krate.is_test(&file.module) {
            continue;
        }
        for reference in krate.references(file) {
            let Target::Internal(path) = &reference.target else {
                continue;
            };
            let target = krate.module_of(path, &modules);
            if krate.is_test(&target) {
                continue;
            }
            let common = file
                .module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            // A parent naming its child, or a child naming its ancestor.
            if common == file.module.len() || common == target.len() {
                continue;
            }
            let parent = file.module[..common].to_vec();
            let edge = (file.module[common].clone(), target[common].clone());
            levels
                .entry(parent)
                .or_default()
                .entry(edge)
                .or_insert((file.path.clone(), reference.line));
        }
    }
    for (parent, edges) in &levels {
        for (cycle, knot) in cycles(edges) {
            let at = if parent.is_empty() {
                "the crate root".to_string()
            } else {
                parent.join("::")
            };
            let mut text = format!(
                "{}: circles: modules of {at} import each other: {} (all of {} reach each other)\n",
                krate.name,
                cycle.join(" -> "),
                knot.join(", ")
            );
            for pair in cycle.windows(2) {
                if let Some((file, line)) = edges.get(&(pair[0].clone(), pair[1].clone())) {
                    let _ = writeln!(text, "  {}:{line}: {} -> {}", rel(file), pair[0], pair[1]);
                }
            }
            let key = format!("{}: circles in {at}: {}", krate.name, knot.join(", "));
            findings.add(key, text);
        }
    }
}

/// Per strongly connected component with more than one module: its
/// shortest cycle through its first module, and all its modules.
fn cycles(edges: &Edges) -> Vec<(Vec<String>, Vec<String>)> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().insert(b);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for m in next.get(n).into_iter().flatten() {
                if seen.insert(*m) {
                    stack.push(m);
                }
            }
        }
        seen
    };
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for start in next.keys() {
        if reported.contains(start) || !reach(start).contains(start) {
            continue;
        }
        // The shortest way back to `start` (breadth first).
        let mut back: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([*start]);
        let mut last = *start;
        'search: while let Some(n) = queue.pop_front() {
            for m in next.get(n).into_iter().flatten() {
                if *m == *start {
                    last = n;
                    break 'search;
                }
                if !back.contains_key(m) {
                    back.insert(m, n);
                    queue.push_back(m);
                }
            }
        }
        // start -> ... -> last -> start, read backwards from `last`.
        let mut cycle = vec![start.to_string()];
        let mut n = last;
        while n != *start {
            cycle.push(n.to_string());
            n = back[n];
        }
        cycle.push(start.to_string());
        cycle.reverse();
        let component: BTreeSet<&str> = reach(start)
            .into_iter()
            .filter(|m| reach(m).contains(start))
            .collect();
        reported.extend(component.iter().copied());
        out.push((cycle, component.iter().map(|m| m.to_string()).collect()));
    }
    out
}

fn sizes(krate: &Crate, findings: &mut Findings) {
    for file in &krate.files {
        let path = rel(&file.path);
        if krate.is_test(&file.module) || GENERATED.contains(&path.as_str()) {
            continue;
        }
        if file.lines > MAX_FILE_LINES {
            findings.add(
                format!("{path}: size"),
                format!(
                    "{path}:{}: size: {} lines, over {MAX_FILE_LINES}: split it where its parts have names",
                    MAX_FILE_LINES + 1,
                    file.lines
                ),
            );
        }
    }
}

fn docs(findings: &mut Findings) {
    for (name, max) in [
        ("ARCHITECTURE.md", MAX_ARCHITECTURE_BYTES),
        ("README.md", MAX_README_BYTES),
    ] {
        let len = std::fs::metadata(repo().join(name)).map_or(0, |m| m.len());
        if len > max {
            findings.add(
                format!("{name}: docs size"),
                format!(
                    "{name}:1: docs: {len} bytes, over {max}: say less, or move detail to docs/"
                ),
            );
        }
    }
    let mut pages = vec![repo().join("README.md"), repo().join("ARCHITECTURE.md")];
    if let Ok(entries) = std::fs::read_dir(repo().join("docs")) {
        pages.extend(
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md")),
        );
    }
    let root = repo().canonicalize().expect("repository root");
    for page in pages {
        let Ok(text) = std::fs::read_to_string(&page) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for target in links(line) {
                let target = target.split('#').next().unwrap_or_default();
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let path = page.parent().expect("page folder").join(target);
                let inside = path.canonicalize().is_ok_and(|p| p.starts_with(&root));
                if !inside {
                    let page = rel(&page);
                    findings.add(
                        format!("{page}: docs link {target}"),
                        format!(
                            "{page}:{}: docs: link `{target}` does not land on a file in the repository",
                            n + 1
                        ),
                    );
                }
            }
        }
    }
}

/// The targets of `[text](target)` links on one line.
fn links(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(p) = rest.find("](") {
        let after = &rest[p + 2..];
        let Some(end) = after.find(')') else { break };
        out.push(after[..end].trim());
        rest = &after[end..];
    }
    out
}

/// Tidy on a crate of its own making: it must see what it is for, and
/// nothing in comments or strings.
#[test]
fn tidy_sees_a_circle_and_a_layer_break_but_not_text() {
    let dir = std::env::temp_dir().join(format!("bulkhead-tidy-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("sched")).unwrap();
    let files = [
        (
            "lib.rs",
            "mod a;\nmod b;\nmod engine;\nmod sched;\n#[cfg(test)]\nmod tests;\n",
        ),
        (
            "a.rs",
            "use crate::b::X; // crate::engine::g\npub struct Y;\n",
        ),
        (
            "b.rs",
            "pub struct X;\nfn f() {\n    let _ = crate::a::Y;\n}\n",
        ),
        (
            "engine.rs",
            "/* use crate::sched::run; */\nconst S: &str = \"crate::sched::run\";\npub fn g() {\n    super::sched::run();\n}\n",
        ),
        ("sched/mod.rs", "mod queue;\npub use queue::run;\n"),
        ("sched/queue.rs", "pub fn run() {}\n"),
        (
            "tests.rs",
            "use crate::sched::run;\nuse crate::engine::g;\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(src.join(name), text).unwrap();
    }
    let krate = Crate::read("bulkhead-gpu-host", &src);
    let mut findings = Findings::default();
    layers(&krate, &mut findings);
    circles(&krate, &mut findings);
    std::fs::remove_dir_all(&dir).unwrap();
    let all: Vec<&String> = findings.0.values().collect();
    // engine.rs line 4 only: not its comment (1) or string (2).
    let layer: Vec<&&String> = all.iter().filter(|t| t.contains("layers")).collect();
    assert_eq!(layer.len(), 1, "{all:?}");
    assert!(layer[0].contains("engine.rs:4: layers: `engine` must not import `crate::sched`"));
    let circle: Vec<&&String> = all.iter().filter(|t| t.contains("circles")).collect();
    assert_eq!(circle.len(), 1, "{all:?}");
    assert!(circle[0].contains("a -> b -> a"), "{circle:?}");
    assert!(circle[0].contains("a.rs:1: a -> b") && circle[0].contains("b.rs:3: b -> a"));
}
