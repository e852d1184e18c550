//! Reads a crate's sources the way tidy needs them: which module each file
//! is, which are test modules, and every path it names (`use` trees and
//! inline `crate::`/`super::`/`self::` paths, and external crate names),
//! with comments and literals blanked so that text in them is never read
//! as code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside one crate: `["sched", "batch"]`; the root is `[]`.
pub type ModPath = Vec<String>;

/// One source file of a crate.
#[derive(Debug)]
pub struct File {
    pub path: PathBuf,
    pub module: ModPath,
    pub lines: usize,
    /// Code with comments, strings and chars blanked (newlines kept).
    pub code: String,
}

/// A path a file names, resolved to absolute segments within the crate
/// (first segment not `crate`), or an external crate's path.
#[derive(Debug, Clone)]
pub struct Reference {
    pub line: usize,
    pub target: Target,
}

#[derive(Debug, Clone)]
pub enum Target {
    /// `crate::a::b::Item`, resolved: `["a", "b", "Item"]`.
    Internal(Vec<String>),
    /// An external crate's name (`tonic`, `bulkhead_protocol`).
    External(String),
}

/// A crate's sources under its `src/` folder.
#[derive(Debug)]
pub struct Crate {
    pub name: String,
    pub files: Vec<File>,
    /// Modules declared `#[cfg(test)] mod x;`, or named `tests`.
    pub test_modules: BTreeSet<ModPath>,
    /// Names bound by `use`: (module, name) -> absolute path of the item.
    pub reexports: BTreeMap<(ModPath, String), Vec<String>>,
}

impl Crate {
    pub fn read(name: &str, src: &Path) -> Crate {
        let mut files = Vec::new();
        collect(src, src, &mut files);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut test_modules = BTreeSet::new();
        let mut reexports = BTreeMap::new();
        for file in &files {
            if file.module.last().is_some_and(|m| m == "tests") {
                test_modules.insert(file.module.clone());
            }
            for child in test_children(&file.code) {
                let mut m = file.module.clone();
                m.push(child);
                test_modules.insert(m);
            }
            // Every `use` binds a name its module and the module's children
            // can reach the item by; globs are not followed.
            for (_, path, name) in use_paths(&file.code) {
                if name == "*" {
                    continue;
                }
                if let Some(abs) = absolute(&file.module, &path) {
                    reexports.insert((file.module.clone(), name), abs);
                }
            }
        }
        Crate {
            name: name.to_string(),
            files,
            test_modules,
            reexports,
        }
    }

    /// Whether `module` is a test module or inside one.
    pub fn is_test(&self, module: &[String]) -> bool {
        (1..=module.len()).any(|n| self.test_modules.contains(&module[..n]))
    }

    /// The modules this crate has files for.
    pub fn modules(&self) -> BTreeSet<ModPath> {
        self.files.iter().map(|f| f.module.clone()).collect()
    }

    /// Every path `file` names.
    pub fn references(&self, file: &File) -> Vec<Reference> {
        let mut out = Vec::new();
        let mut push = |line: usize, path: &[String]| {
            let first = path[0].as_str();
            if matches!(first, "crate" | "super" | "self") {
                if let Some(abs) = absolute(&file.module, path) {
                    out.push(Reference {
                        line,
                        target: Target::Internal(abs),
                    });
                }
            } else if path.len() > 1 || first.starts_with("bulkhead_") || first == "tonic" {
                out.push(Reference {
                    line,
                    target: Target::External(first.to_string()),
                });
            }
        };
        for (line, path, _) in use_paths(&file.code) {
            if path.last().is_some_and(|l| l == "*") {
                push(line, &path[..path.len() - 1]);
                continue;
            }
            push(line, &path);
        }
        for (line, path) in inline_paths(&file.code) {
            push(line, &path);
        }
        for name in WATCHED {
            for line in word_lines(&file.code, &format!("{name}::")) {
                out.push(Reference {
                    line,
                    target: Target::External(name.to_string()),
                });
            }
        }
        out
    }

    /// The module an absolute path lands in: the longest prefix that is a
    /// module, following `pub use` re-exports to where an item lives.
    pub fn module_of(&self, path: &[String], modules: &BTreeSet<ModPath>) -> ModPath {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let n = (0..=path.len())
                .rev()
                .find(|&n| modules.contains(&path[..n]))
                .unwrap_or(0);
            let module = path[..n].to_vec();
            let Some(name) = path.get(n) else {
                return module;
            };
            match self.reexports.get(&(module.clone(), name.clone())) {
                Some(target) if target != &path[..=n] => {
                    let mut next = target.clone();
                    next.extend_from_slice(&path[n + 1..]);
                    path = next;
                }
                _ => return module,
            }
        }
        path
    }
}

/// External crates whose inline paths (`tonic::Status`) count as imports.
const WATCHED: [&str; 3] = ["tonic", "bulkhead_protocol", "prost"];

/// Lines where `word` starts a path outside `use` statements.
fn word_lines(code: &str, word: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find(word) {
        let start = from + p;
        from = start + word.len();
        let prev = start.checked_sub(1).map(|i| code.as_bytes()[i]);
        if prev.is_some_and(|c| is_ident(c) || c == b':') || in_use(code, start) {
            continue;
        }
        out.push(line_at(code, start));
    }
    out
}

fn collect(src: &Path, dir: &Path, out: &mut Vec<File>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(src, &path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(src).expect("under src");
        let mut module: ModPath = rel
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        let last = module.pop().expect("file name");
        match last.as_str() {
            "lib.rs" | "main.rs" | "mod.rs" => {}
            other => module.push(other.trim_end_matches(".rs").to_string()),
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let code = blank_tests(&blank(&text));
        out.push(File {
            lines: text.lines().count(),
            path,
            module,
            code,
        });
    }
}

/// Resolves `crate::`, `super::` and `self::` against `module`.
fn absolute(module: &[String], path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = path;
    match path.first()?.as_str() {
        "crate" => {
            base = Vec::new();
            rest = &path[1..];
        }
        "super" | "self" => {
            base = module.to_vec();
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "super" => {
                        base.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// Replaces comments, string and char literals with spaces, keeping
/// newlines so line numbers stay true.
pub fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let wipe = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
            wipe(&mut out, i, end);
            i = end;
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j] == b'/' && b.get(j + 1) == Some(&b'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == b'*' && b.get(j + 1) == Some(&b'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            wipe(&mut out, i, j);
            i = j;
        } else if c == b'r'
            && matches!(b.get(i + 1), Some(b'"' | b'#'))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let start = i + 2 + hashes;
            let end = b[start..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| start + p + close.len());
            wipe(&mut out, i, end);
            i = end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            wipe(&mut out, i, end);
            i = end;
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{..}'), not a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p + 1)
            } else {
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 2 + len)
            };
            match end {
                Some(end) => {
                    wipe(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).expect("blanking keeps UTF-8 boundaries")
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Blanks `#[cfg(test)] mod name { ... }` blocks: test code may reach
/// anywhere.
fn blank_tests(code: &str) -> String {
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(p) = out[from..].find("#[cfg(test)]") {
        let start = from + p;
        let after = start + "#[cfg(test)]".len();
        let rest = &out[after..];
        let trimmed = rest.trim_start();
        let body = trimmed
            .strip_prefix("mod ")
            .and_then(|r| r.find(['{', ';']).map(|q| (r.as_bytes()[q], q)));
        if let Some((b'{', q)) = body {
            let open = after + (rest.len() - trimmed.len()) + 4 + q;
            let close = matching_brace(&out, open);
            let blanked: String = out[start..close]
                .chars()
                .map(|c| if c == '\n' { '\n' } else { ' ' })
                .collect();
            out.replace_range(start..close, &blanked);
            from = close;
        } else {
            from = after;
        }
    }
    out
}

fn matching_brace(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// Children declared `#[cfg(test)] mod name;` (other attributes allowed
/// in between).
fn test_children(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("#[cfg(test)]") {
        let mut rest = code[from + p + "#[cfg(test)]".len()..].trim_start();
        while rest.starts_with("#[") {
            rest = rest[rest.find(']').map_or(rest.len(), |q| q + 1)..].trim_start();
        }
        if let Some(decl) = rest.strip_prefix("mod ") {
            let name: String = decl.chars().take_while(|c| is_ident(*c as u8)).collect();
            if decl[name.len()..].trim_start().starts_with(';') {
                out.push(name);
            }
        }
        from += p + 1;
    }
    out
}

fn line_at(code: &str, offset: usize) -> usize {
    code[..offset].bytes().filter(|&c| c == b'\n').count() + 1
}

/// Every `use` tree, expanded: (line, path, the name it binds).
fn use_paths(code: &str) -> Vec<(usize, Vec<String>, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(p) = code[from..].find("use ") {
        let start = from + p;
        from = start + 4;
        if start > 0 && is_ident(code.as_bytes()[start - 1]) {
            continue;
        }
        if !use_statement_at(code, start) {
            continue;
        }
        let Some(end) = code[from..].find(';') else {
            break;
        };
        let line = line_at(code, start);
        for (path, name) in expand(&code[from..from + end]) {
            out.push((line, path, name));
        }
        from += end;
    }
    out
}

/// Whether the `use` at `start` begins a statement: after `;`, `{`, `}`,
/// an attribute's `]`, a visibility, or at the start of the file.
fn use_statement_at(code: &str, start: usize) -> bool {
    let mut before = code[..start].trim_end();
    if before.ends_with(')')
        && let Some(open) = before.rfind('(')
        && before[..open].trim_end().ends_with("pub")
    {
        before = &before[..open];
    }
    let before = before.trim_end();
    let before = before.strip_suffix("pub").map_or(before, str::trim_end);
    before.is_empty() || before.ends_with([';', '{', '}', ']'])
}

/// `a::{b, c::{d, e as f}, g::self}` -> ([a,b], b), ([a,c,d], d),
/// ([a,c,e], f), ([a,g], g).
fn expand(tree: &str) -> Vec<(Vec<String>, String)> {
    fn go(prefix: &[String], tree: &str, out: &mut Vec<(Vec<String>, String)>) {
        let tree = tree.trim().trim_start_matches("::");
        if let Some(open) = tree.find('{') {
            let mut prefix = prefix.to_vec();
            prefix.extend(segments(&tree[..open]));
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&prefix, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&prefix, &inner[start..], out);
        } else if !tree.is_empty() {
            let mut words = tree.split_whitespace();
            let path_text = words.next().unwrap_or_default();
            let alias = match (words.next(), words.next()) {
                (Some("as"), Some(alias)) => Some(alias.to_string()),
                _ => None,
            };
            let mut path = prefix.to_vec();
            path.extend(segments(path_text));
            if path.last().is_some_and(|l| l == "self") {
                path.pop();
            }
            let Some(last) = path.last().cloned() else {
                return;
            };
            out.push((path, alias.unwrap_or(last)));
        }
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// `crate::a::b`, `super::super::x`, `self::y` outside `use` statements.
fn inline_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for key in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(p) = code[from..].find(key) {
            let start = from + p;
            from = start + key.len();
            if start > 0 && (is_ident(bytes[start - 1]) || bytes[start - 1] == b':') {
                continue;
            }
            let mut end = start;
            while end < bytes.len() && (is_ident(bytes[end]) || bytes[end] == b':') {
                end += 1;
            }
            let path = segments(&code[start..end]);
            // Paths inside `use` trees are read by `use_paths`.
            if in_use(code, start) {
                continue;
            }
            out.push((line_at(code, start), path));
        }
    }
    out
}

/// Whether `offset` lies inside a `use ...;` statement.
fn in_use(code: &str, offset: usize) -> bool {
    let mut from = code[..offset].rfind(';').map_or(0, |p| p + 1);
    while let Some(p) = code[from..offset].find("use ") {
        let u = from + p;
        if (u == 0 || !is_ident(code.as_bytes()[u - 1])) && use_statement_at(code, u) {
            return true;
        }
        from = u + 4;
    }
    false
}
