//! Reading a policy folder: which files count, their size and number limits,
//! and TOML parsing with every syntax error kept. Checks that look at the
//! values (and across files) are in `validate`.
//!
//! Which files are read: `gateway.toml` and `trust.toml` (both optional),
//! `classes/*.toml` and `tenants/*.toml`. Names starting with `.` (hidden
//! files, editor locks such as `.#x.toml`, swap files) and names not ending in
//! `.toml` (`x.toml~`, `x.toml.example`, `README.md`) are skipped, as are
//! subfolders of `classes/` and `tenants/`.
//!
//! Symlinks are followed: Kubernetes mounts a ConfigMap as symlinks into a
//! hidden `..data` folder, and that is the main way policies are deployed.
//! What a name finally points at must be a regular file; a folder, FIFO,
//! socket or device named `*.toml` is an error naming the file, and is never
//! opened (a FIFO would block the reader).

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::files::{Folder, Parsed, io_reason};
use super::validate::validate;
use super::{Policy, PolicyError, PolicyErrors, SourceFile};

/// Largest policy file read, in bytes. Real ones are a few KiB; the cap keeps
/// a mistaken `cp model.gguf tenants/x.toml` from being read into memory.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Most `tenants/*.toml` files one folder may hold.
pub const MAX_TENANT_FILES: usize = 10_000;
/// Most `classes/*.toml` files one folder may hold.
pub const MAX_CLASS_FILES: usize = 1_000;
/// Syntax errors reported per file; past this a broken file only adds noise.
const MAX_SYNTAX_ERRORS_PER_FILE: usize = 10;

/// Reads and validates every file of the policy folder `dir`.
///
/// Errors name files relative to `dir` (the folder itself is `.`); see
/// [`PolicyErrors::in_dir`] to show them as paths. They come sorted by file,
/// then position.
pub fn load(dir: &Path) -> Result<Policy, PolicyErrors> {
    let dir = std::path::absolute(dir).map_err(|e| {
        PolicyErrors(vec![PolicyError::at_path(
            Path::new("."),
            format!("cannot resolve the policy folder: {e}"),
        )])
    })?;
    let mut errors = Vec::new();
    let folder = read_folder(&dir, &mut errors);
    let policy = validate(&dir, folder, &mut errors);
    if errors.is_empty() {
        Ok(policy)
    } else {
        errors.sort_by(|a, b| {
            (&a.file, a.line, a.col, &a.message).cmp(&(&b.file, b.line, b.col, &b.message))
        });
        errors.dedup();
        Err(PolicyErrors(errors))
    }
}

/// The files [`load`] reads in `dir` with the SHA-256 of each, whether or
/// not they make a valid policy: what the audit log records for a reload
/// that failed (a successful load lists them in [`Policy::files`]).
/// Unreadable files are left out.
pub fn file_digests(dir: &Path) -> Vec<(PathBuf, [u8; 32])> {
    let mut errors = Vec::new();
    read_folder(dir, &mut errors).files
}

fn read_folder(dir: &Path, errors: &mut Vec<PolicyError>) -> Folder {
    let mut folder = Folder::default();
    match fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            errors.push(dot_error("the policy folder is not a folder"));
            return folder;
        }
        Err(e) => {
            errors.push(dot_error(format!(
                "cannot read the policy folder {}: {}",
                dir.display(),
                io_reason(&e)
            )));
            return folder;
        }
    }
    folder.gateway = read_optional(dir, Path::new("gateway.toml"), &mut folder.files, errors);
    folder.trust = read_optional(dir, Path::new("trust.toml"), &mut folder.files, errors);
    for name in list_toml(dir, "classes", MAX_CLASS_FILES, errors) {
        if let Some(parsed) = read_parsed(dir, &name, &mut folder.files, errors) {
            folder.classes.push(parsed);
        }
    }
    for name in list_toml(dir, "tenants", MAX_TENANT_FILES, errors) {
        if let Some(parsed) = read_parsed(dir, &name, &mut folder.files, errors) {
            folder.tenants.push(parsed);
        }
    }
    folder
}

fn dot_error(message: impl Into<String>) -> PolicyError {
    PolicyError::at_path(Path::new("."), message)
}

/// A file that may be absent; a dangling symlink is not "absent".
fn read_optional<T: DeserializeOwned>(
    dir: &Path,
    name: &Path,
    files: &mut Vec<(PathBuf, [u8; 32])>,
    errors: &mut Vec<PolicyError>,
) -> Option<Parsed<T>> {
    match fs::symlink_metadata(dir.join(name)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        _ => read_parsed(dir, name, files, errors),
    }
}

fn read_parsed<T: DeserializeOwned>(
    dir: &Path,
    name: &Path,
    files: &mut Vec<(PathBuf, [u8; 32])>,
    errors: &mut Vec<PolicyError>,
) -> Option<Parsed<T>> {
    let (source, digest) = read_source(dir, name).map_err(|e| errors.push(e)).ok()?;
    files.push((name.to_path_buf(), digest));
    let doc = parse(&source, errors);
    Some(Parsed {
        source: Arc::new(source),
        doc,
    })
}

/// The `*.toml` files directly in `dir/sub`, sorted; relative to `dir`.
fn list_toml(dir: &Path, sub: &str, limit: usize, errors: &mut Vec<PolicyError>) -> Vec<PathBuf> {
    let entries = match fs::read_dir(dir.join(sub)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            errors.push(PolicyError::at_path(
                Path::new(sub),
                format!("cannot list the folder: {}", io_reason(&e)),
            ));
            return Vec::new();
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                errors.push(PolicyError::at_path(
                    Path::new(sub),
                    format!("cannot list the folder: {}", io_reason(&e)),
                ));
                return Vec::new();
            }
        };
        let file_name = entry.file_name();
        let lossy = file_name.to_string_lossy();
        if lossy.starts_with('.') || Path::new(&file_name).extension() != Some("toml".as_ref()) {
            continue;
        }
        if file_name.to_str().is_none() {
            errors.push(PolicyError::at_path(
                &Path::new(sub).join(&file_name),
                "the file name is not UTF-8",
            ));
            continue;
        }
        names.push(Path::new(sub).join(file_name));
        if names.len() > limit {
            errors.push(PolicyError::at_path(
                Path::new(sub),
                format!("more than {limit} *.toml files; none of them were read"),
            ));
            return Vec::new();
        }
    }
    names.sort();
    names
}

/// Reads `dir/name` as UTF-8 text of at most [`MAX_FILE_BYTES`], with the
/// SHA-256 of its bytes.
fn read_source(dir: &Path, name: &Path) -> Result<(SourceFile, [u8; 32]), PolicyError> {
    let path = dir.join(name);
    let fail = |message: String| PolicyError::at_path(name, message);
    // `metadata` follows symlinks: the target is what must be a regular file.
    let meta = fs::metadata(&path).map_err(|e| fail(format!("cannot read: {}", io_reason(&e))))?;
    if !meta.is_file() {
        return Err(fail(format!(
            "is not a regular file ({})",
            file_kind(&meta)
        )));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(fail(too_big(meta.len())));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    fs::File::open(&path)
        // The file may have grown since `metadata`; never read past the cap.
        .and_then(|file| file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| fail(format!("cannot read: {}", io_reason(&e))))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(fail(too_big(bytes.len() as u64)));
    }
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    match String::from_utf8(bytes) {
        Ok(text) => Ok((SourceFile::new(name, text), digest)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let source = SourceFile::new(name, String::from_utf8_lossy(e.as_bytes()));
            Err(source.error_at(at..at, "not UTF-8 text (TOML files are UTF-8)"))
        }
    }
}

fn too_big(len: u64) -> String {
    format!("is {len} bytes; policy files are limited to {MAX_FILE_BYTES} bytes (1 MiB)")
}

fn file_kind(meta: &fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_dir() {
        "a folder"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else {
        "not a file"
    }
}

/// Parses `source` as a `T`, reporting every syntax error, or else the first
/// shape error (unknown field, wrong type, missing field) serde stops at.
fn parse<T: DeserializeOwned>(source: &SourceFile, errors: &mut Vec<PolicyError>) -> Option<T> {
    let (table, syntax) = toml::de::DeTable::parse_recoverable(&source.text);
    if !syntax.is_empty() {
        let shown = syntax.len().min(MAX_SYNTAX_ERRORS_PER_FILE);
        errors.extend(syntax[..shown].iter().map(|e| toml_error(source, e)));
        if let Some(next) = syntax.get(shown) {
            let span = next.span().unwrap_or(0..0);
            let more = syntax.len() - shown;
            errors.push(source.error_at(span, format!("{more} more syntax errors not shown")));
        }
        return None;
    }
    T::deserialize(toml::de::Deserializer::from(table))
        .map_err(|e| errors.push(toml_error(source, &e)))
        .ok()
}

/// toml's error as one line: its bare message (no source snippet), at its span.
pub(super) fn toml_error(source: &SourceFile, e: &toml::de::Error) -> PolicyError {
    let message = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    source.error_at(e.span().unwrap_or(0..0), message)
}

#[cfg(test)]
mod tests;
