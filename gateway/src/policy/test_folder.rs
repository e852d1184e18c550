//! A scratch policy folder for tests, removed on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub(crate) struct TestFolder {
    path: PathBuf,
}

impl TestFolder {
    pub(crate) fn new() -> TestFolder {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "bulkhead-policy-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create a scratch folder");
        TestFolder { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `text` to `name` (relative), creating folders as needed.
    pub(crate) fn write(&self, name: &str, text: impl AsRef<[u8]>) -> &TestFolder {
        let path = self.path.join(name);
        fs::create_dir_all(path.parent().expect("a file has a parent")).expect("create folders");
        fs::write(&path, text).expect("write a test file");
        self
    }

    pub(crate) fn remove(&self, name: &str) -> &TestFolder {
        fs::remove_file(self.path.join(name)).expect("remove a test file");
        self
    }
}

impl Drop for TestFolder {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}
