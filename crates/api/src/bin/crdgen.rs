//! Writes the CustomResourceDefinitions of `gpuqueue-api` as YAML, one file per CRD, into the
//! directory given as the only argument (`make crds` passes `crds/`), or prints them to stdout.

use std::{fs, path::PathBuf, process::ExitCode};

fn main() -> ExitCode {
    let files = match gpuqueue_api::crd_files() {
        Ok(files) => files,
        Err(error) => {
            eprintln!("crdgen: cannot render the CRDs: {error}");
            return ExitCode::FAILURE;
        }
    };
    match std::env::args_os().nth(1).map(PathBuf::from) {
        Some(dir) => {
            for (name, text) in files {
                let path = dir.join(name);
                if let Err(error) = fs::write(&path, text) {
                    eprintln!("crdgen: cannot write {}: {error}", path.display());
                    return ExitCode::FAILURE;
                }
            }
        }
        None => files.iter().for_each(|(_, text)| print!("---\n{text}")),
    }
    ExitCode::SUCCESS
}
