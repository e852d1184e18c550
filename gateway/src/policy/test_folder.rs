//! A scratch policy folder for tests, removed on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::signing::{DirOptions, KeyKind, Manifest, SigningKey};

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

    /// A publisher key pair in `keys/publisher.pem` / `keys/publisher.pub.pem`
    /// and a `trust.toml` trusting it as `test-publisher`.
    pub(crate) fn trust_publisher(&self) -> &TestFolder {
        let key = SigningKey::generate(KeyKind::P256);
        self.write(
            "keys/publisher.pem",
            key.to_pkcs8_pem().expect("encode a key").as_bytes(),
        )
        .write("keys/publisher.pub.pem", key.public_key().to_spki_pem())
        .write(
            "trust.toml",
            "[[publishers]]\nname = \"test-publisher\"\npublic_key = \"keys/publisher.pub.pem\"\n",
        )
    }

    /// `models/NAME/NAME.gguf` holding `weights`, signed with
    /// `keys/publisher.pem` (see [`trust_publisher`](Self::trust_publisher))
    /// into `models/NAME.sig`.
    pub(crate) fn signed_model(&self, name: &str, weights: &[u8]) -> &TestFolder {
        self.write(&format!("models/{name}/{name}.gguf"), weights);
        let key = SigningKey::from_pem_file(&self.path.join("keys/publisher.pem"))
            .expect("trust_publisher wrote the key");
        let folder = self.path.join("models").join(name);
        let manifest =
            Manifest::of_dir(&folder, &DirOptions::default()).expect("hash the model folder");
        self.write(&format!("models/{name}.sig"), manifest.sign(&key))
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
