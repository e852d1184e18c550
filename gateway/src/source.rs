//! Config files (policy TOML) and errors at a `file:line:col` in them: the
//! leaf every subsystem that checks its own config table reports through.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A policy file's name (as shown in errors) and text.
#[derive(Debug)]
pub struct SourceFile {
    /// Path relative to the policy folder, e.g. `tenants/acme.toml`.
    pub name: PathBuf,
    pub text: String,
}

impl SourceFile {
    pub fn new(name: impl Into<PathBuf>, text: impl Into<String>) -> SourceFile {
        SourceFile {
            name: name.into(),
            text: text.into(),
        }
    }

    /// An error at byte range `span` of this file.
    pub fn error_at(&self, span: Range<usize>, message: impl Into<String>) -> PolicyError {
        let (line, col) = line_col(&self.text, span.start);
        PolicyError {
            file: self.name.clone(),
            line,
            col,
            message: message.into(),
        }
    }

    /// An error about the file as a whole (reported at 1:1).
    pub fn error(&self, message: impl Into<String>) -> PolicyError {
        self.error_at(0..0, message)
    }

    /// 1-based line and column (in chars) of byte `offset`.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        line_col(&self.text, offset)
    }
}

/// One problem in a policy folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub file: PathBuf,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub col: usize,
    pub message: String,
}

impl PolicyError {
    /// An error about a path that could not be read as a file at all.
    pub fn at_path(file: &Path, message: impl Into<String>) -> PolicyError {
        PolicyError {
            file: file.to_path_buf(),
            line: 1,
            col: 1,
            message: message.into(),
        }
    }
}

impl PolicyError {
    /// This error with its file shown as a path under `dir` (the folder
    /// itself, `.`, becomes `dir`), so editors and terminals can open it.
    pub fn in_dir(&self, dir: &Path) -> PolicyError {
        let file = if self.file == Path::new(".") {
            dir.to_path_buf()
        } else {
            dir.join(&self.file)
        };
        PolicyError {
            file,
            ..self.clone()
        }
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.line,
            self.col,
            self.message
        )
    }
}

/// Every problem found in a policy folder, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyErrors(pub Vec<PolicyError>);

impl PolicyErrors {
    /// Every error with its file shown under `dir` (see [`PolicyError::in_dir`]).
    pub fn in_dir(&self, dir: &Path) -> PolicyErrors {
        PolicyErrors(self.0.iter().map(|e| e.in_dir(dir)).collect())
    }
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

/// 1-based line and column (in chars) of byte `offset`, clamped to the text.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_to_one_based_lines_and_char_columns() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 4), (1, 5));
        assert_eq!(line_col(text, 6), (2, 1));
        // `=` after the two-byte `é` is the 4th char of line 2.
        let eq = text.rfind('=').unwrap();
        assert_eq!(line_col(text, eq), (2, 4));
        assert_eq!(line_col(text, 10_000), (3, 1));
    }

    #[test]
    fn errors_print_as_file_line_col_message() {
        let file = SourceFile::new("tenants/acme.toml", "id = \"acme\"\nclass = 3\n");
        let e = file.error_at(20..21, "class must be a string");
        assert_eq!(
            e.to_string(),
            "tenants/acme.toml:2:9: class must be a string"
        );
    }
}
