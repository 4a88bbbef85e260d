//! What the CLI's tests share.

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::Path;

/// A scratch folder, removed when the test drops it (even when it fails).
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    /// A new empty folder whose name starts with `gpuqueue-cli-<name>`.
    pub fn new(name: &str) -> Self {
        Self(
            tempfile::Builder::new()
                .prefix(&format!("gpuqueue-cli-{name}-"))
                .tempdir()
                .unwrap(),
        )
    }
}

impl Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.path().as_os_str()
    }
}
