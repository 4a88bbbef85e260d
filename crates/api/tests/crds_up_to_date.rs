//! `crds/` is generated from the Rust types and committed; this fails when someone edits a type
//! without running `make crds`, so the API server never gets a schema that differs from the code.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly

use std::{fs, path::PathBuf};

#[test]
fn committed_crds_match_the_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    for (name, generated) in gpuqueue_api::crd_files().unwrap() {
        let committed = fs::read_to_string(dir.join(&name)).unwrap_or_default();
        assert!(
            committed == generated,
            "crds/{name} is stale: run `make crds` and commit the result"
        );
    }
    let committed_files = fs::read_dir(&dir).unwrap().count();
    assert_eq!(
        committed_files,
        gpuqueue_api::crd_files().unwrap().len(),
        "crds/ holds files that crdgen does not write"
    );
}
