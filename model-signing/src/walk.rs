//! Listing a model folder the way model-signing's `files` serialization
//! does: every regular file below the folder (hidden ones included), named by
//! its `/`-separated path relative to the folder, sorted component by
//! component (Python's `PurePosixPath` order), minus the ignored paths
//! (each one a file or a whole subtree). A symlink, or anything that is
//! neither file nor folder, is refused, as model-signing refuses it by
//! default.

use std::cmp::Ordering;
use std::fs;
use std::path::{Path, PathBuf};

use super::{MAX_FILES, MAX_FOLDER_DEPTH, MAX_PATH_BYTES, ModelError};

/// What model-signing ignores by default (`--ignore-git-paths`), relative
/// to the model folder: only at its top, not in subfolders.
pub const DEFAULT_IGNORED: [&str; 4] = [".git", ".gitattributes", ".github", ".gitignore"];

/// A file of the model folder.
#[derive(Debug, Clone)]
pub(crate) struct ListedFile {
    /// The manifest name: relative, `/`-separated, normalized.
    pub name: String,
    /// Where it is on disk.
    pub path: PathBuf,
}

/// Compares manifest names as Python compares `PurePosixPath`s: by
/// components, so `a/b` sorts before `a-b/x` (plain string order would put
/// `-` before `/`). model-signing lists resources in this order and the
/// subject digest depends on it.
pub(crate) fn compare_names(a: &str, b: &str) -> Ordering {
    a.split('/').cmp(b.split('/'))
}

/// Checks a manifest name or ignore path: relative, `/`-separated, no empty,
/// `.` or `..` component, no NUL, within [`MAX_PATH_BYTES`]. model-signing
/// only writes names of this form; anything else could name a file outside
/// the folder or two ways of naming one file.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an empty path".into());
    }
    if name.len() > MAX_PATH_BYTES {
        return Err(format!("a path longer than {MAX_PATH_BYTES} bytes"));
    }
    if name.contains('\0') {
        return Err(format!("{name:?} contains a NUL byte"));
    }
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "{name:?} is not a normalized relative path (empty, `.` or `..` component, or a leading `/`)"
        ));
    }
    Ok(())
}

/// Paths (relative to the folder, checked with [`check_name`]) to leave out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ignored(Vec<String>);

impl Ignored {
    /// model-signing's defaults plus `extra`.
    pub fn with_defaults(extra: impl IntoIterator<Item = String>) -> Ignored {
        let mut ignored = Ignored(DEFAULT_IGNORED.iter().map(|p| p.to_string()).collect());
        for path in extra {
            ignored.add(path);
        }
        ignored
    }

    pub fn add(&mut self, path: String) {
        if !self.0.contains(&path) {
            self.0.push(path);
        }
    }

    /// Whether `name` is an ignored path or lies below one.
    pub fn covers(&self, name: &str) -> bool {
        self.0.iter().any(|ignored| {
            name == ignored
                || name
                    .strip_prefix(ignored.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// The paths, sorted (model-signing writes them in set order; sorting
    /// makes our output reproducible).
    pub fn sorted(&self) -> Vec<String> {
        let mut paths = self.0.clone();
        paths.sort_by(|a, b| compare_names(a, b));
        paths
    }
}

/// Where `path` (absolute, or relative to the current directory; it need
/// not exist yet) lies inside `folder`, as a manifest name; `None` when it
/// is outside. How model-signing's CLI decides to ignore the signature file.
pub(crate) fn name_inside(folder: &Path, path: &Path) -> Option<String> {
    let folder = fs::canonicalize(folder).ok()?;
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(path)
    };
    let resolved = match fs::canonicalize(&path) {
        Ok(resolved) => resolved,
        Err(_) => fs::canonicalize(path.parent()?)
            .ok()?
            .join(path.file_name()?),
    };
    let relative = resolved.strip_prefix(&folder).ok()?;
    let parts: Option<Vec<&str>> = relative.iter().map(|c| c.to_str()).collect();
    let name = parts?.join("/");
    check_name(&name).ok().map(|()| name)
}

/// Every file of `folder` not covered by `ignored`, sorted by
/// [`compare_names`].
pub(crate) fn list_files(folder: &Path, ignored: &Ignored) -> Result<Vec<ListedFile>, ModelError> {
    let meta = fs::symlink_metadata(folder).map_err(ModelError::io(folder))?;
    if !meta.is_dir() {
        return Err(ModelError::Folder {
            path: folder.display().to_string(),
            reason: if meta.file_type().is_symlink() {
                "a symlink; give the model folder itself".into()
            } else {
                "not a folder; a model is signed as a folder of files".into()
            },
        });
    }
    let mut walk = Walk {
        ignored,
        files: Vec::new(),
        folders_seen: 0,
    };
    walk.folder(folder, "", 0)?;
    let mut files = walk.files;
    files.sort_by(|a, b| compare_names(&a.name, &b.name));
    Ok(files)
}

struct Walk<'a> {
    ignored: &'a Ignored,
    files: Vec<ListedFile>,
    folders_seen: usize,
}

impl Walk<'_> {
    fn folder(&mut self, dir: &Path, prefix: &str, depth: usize) -> Result<(), ModelError> {
        if depth > MAX_FOLDER_DEPTH {
            return Err(ModelError::TooMany {
                what: "nested folders",
                limit: MAX_FOLDER_DEPTH,
            });
        }
        self.folders_seen += 1;
        if self.folders_seen > MAX_FILES {
            return Err(ModelError::TooMany {
                what: "folders in the model folder",
                limit: MAX_FILES,
            });
        }
        for entry in fs::read_dir(dir).map_err(ModelError::io(dir))? {
            let entry = entry.map_err(ModelError::io(dir))?;
            let path = entry.path();
            let Some(component) = entry.file_name().to_str().map(str::to_owned) else {
                return Err(ModelError::Folder {
                    path: path.display().to_string(),
                    reason: "the name is not UTF-8, which a manifest cannot hold".into(),
                });
            };
            let name = if prefix.is_empty() {
                component
            } else {
                format!("{prefix}/{component}")
            };
            // Ignored subtrees are never entered (model-signing still looks
            // for symlinks inside them; we need not).
            if self.ignored.covers(&name) {
                continue;
            }
            check_name(&name).map_err(|reason| ModelError::Folder {
                path: path.display().to_string(),
                reason,
            })?;
            let file_type = entry.file_type().map_err(ModelError::io(&path))?;
            if file_type.is_symlink() {
                return Err(ModelError::Folder {
                    path: name,
                    reason: "a symlink; model folders must not contain symlinks \
                             (model-signing refuses them by default)"
                        .into(),
                });
            } else if file_type.is_dir() {
                self.folder(&path, &name, depth + 1)?;
            } else if file_type.is_file() {
                if self.files.len() == MAX_FILES {
                    return Err(ModelError::TooMany {
                        what: "files in the model folder",
                        limit: MAX_FILES,
                    });
                }
                self.files.push(ListedFile { name, path });
            } else {
                return Err(ModelError::Folder {
                    path: name,
                    reason: "neither a regular file nor a folder (a socket, pipe or device)".into(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_by_component_like_pure_posix_path() {
        // sorted([PurePosixPath(p) for p in ...]) in Python 3.11.
        let mut names = vec!["a.b", "a-b/x", "a/b", "a", "B", "a/b/c", "a/-"];
        names.sort_by(|a, b| compare_names(a, b));
        assert_eq!(names, ["B", "a", "a/-", "a/b", "a/b/c", "a-b/x", "a.b"]);
    }

    #[test]
    fn names_must_be_normalized_relative_paths() {
        for good in ["a", "a/b", ".hidden", "sub/.gitignore", "a b/c"] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in [
            "", "/a", "a/", "a//b", "./a", "a/./b", "../a", "a/..", "a\0b",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name(&"x".repeat(MAX_PATH_BYTES + 1)).is_err());
    }

    #[test]
    fn ignored_paths_cover_themselves_and_what_is_below_only() {
        let ignored = Ignored::with_defaults(["model.sig".to_string()]);
        assert!(ignored.covers(".git"));
        assert!(ignored.covers(".git/HEAD"));
        assert!(ignored.covers("model.sig"));
        assert!(!ignored.covers(".gitx"));
        assert!(!ignored.covers("sub/.gitignore"));
        assert!(!ignored.covers("model.sig2"));
    }
}
