#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests fail loudly
//! `kubectl-gpuqueue queues | explain | handovers` when the cluster cannot be reached: the
//! binary, its exit code and the message that says what is wrong. What they show of a live
//! cluster is tested against a real control plane in `e2e/tests/cli_inspect.rs`.

mod common;

use common::Scratch;

use std::process::{Command, Output};

/// The binary with `HOME` at `home` and none of the variables that point a client at a
/// cluster, as on a laptop where nothing was set up.
fn cli(home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-gpuqueue"))
        .args(args)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .output()
        .unwrap()
}

/// Asserts a failure with exit code `code` and nothing on stdout; returns stderr.
fn fails(output: &Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(
        output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

#[test]
fn without_a_kubeconfig_each_command_says_where_it_looked() {
    let home = Scratch::new("no-kubeconfig");
    let expected = format!(
        "error: cannot connect to the cluster: no kubeconfig: $KUBECONFIG is not set and {} does not exist, and this is not a pod in a cluster; pass --kubeconfig FILE or set KUBECONFIG\n",
        home.join(".kube/config").display()
    );
    for args in [
        &["queues"][..],
        &["explain", "vllm-0", "-n", "batch"],
        &["handovers"],
    ] {
        assert_eq!(fails(&cli(&home, args), 1), expected, "{args:?}");
    }

    let missing = home.join("missing.yaml");
    let output = Command::new(env!("CARGO_BIN_EXE_kubectl-gpuqueue"))
        .arg("queues")
        .env("HOME", &home)
        .env("KUBECONFIG", &missing)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(
        fails(&output, 1),
        format!(
            "error: cannot connect to the cluster: no kubeconfig: $KUBECONFIG ({}) names no existing file, and this is not a pod in a cluster; pass --kubeconfig FILE or set KUBECONFIG\n",
            missing.display()
        )
    );

    let stderr = fails(
        &cli(
            &home,
            &["handovers", "--kubeconfig", missing.to_str().unwrap()],
        ),
        1,
    );
    assert_eq!(
        stderr,
        format!(
            "error: cannot connect to the cluster: kubeconfig {} does not exist (--kubeconfig)\n",
            missing.display()
        )
    );
}

#[test]
fn a_broken_kubeconfig_or_an_unreachable_server_is_named() {
    let home = Scratch::new("unreachable");
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let kubeconfig = home.join("config");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: dev, context: {cluster: c, user: u}}]\ncurrent-context: dev\n",
    )
    .unwrap();
    let path = kubeconfig.to_str().unwrap();

    let stderr = fails(&cli(&home, &["queues", "--kubeconfig", path]), 1);
    assert!(
        stderr.starts_with("error: cannot list GpuQueues: "),
        "{stderr}"
    );
    assert!(stderr.contains("Connection refused"), "{stderr}");

    let stderr = fails(
        &cli(
            &home,
            &["explain", "p", "--kubeconfig", path, "--context", "prod"],
        ),
        1,
    );
    assert_eq!(
        stderr,
        format!(
            "error: cannot connect to the cluster: kubeconfig {path} has no context \"prod\" (it has: dev)\n"
        )
    );
    // The same kubeconfig through $KUBECONFIG.
    let output = Command::new(env!("CARGO_BIN_EXE_kubectl-gpuqueue"))
        .args(["handovers", "--context", "prod"])
        .env("HOME", &home)
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(
        fails(&output, 1),
        "error: cannot connect to the cluster: the kubeconfig has no context \"prod\" (it has: dev)\n"
    );

    std::fs::write(&kubeconfig, "clusters: {not: a list}\n").unwrap();
    let stderr = fails(&cli(&home, &["handovers", "--kubeconfig", path]), 1);
    assert!(
        stderr.starts_with(&format!(
            "error: cannot connect to the cluster: kubeconfig {path}: "
        )),
        "{stderr}"
    );
}

#[test]
fn bad_arguments_are_refused_before_connecting() {
    let home = Scratch::new("arguments");
    let stderr = fails(&cli(&home, &["queues", "--request-timeout", "0s"]), 2);
    assert!(
        stderr.contains(
            "invalid value '0s' for '--request-timeout <DURATION>': \"0s\": must be longer than 0s"
        ),
        "{stderr}"
    );
    let stderr = fails(&cli(&home, &["queues", "--request-timeout", "soon"]), 2);
    assert!(
        stderr.contains("\"soon\" is not a duration")
            && stderr.contains("expected a duration such as 30s or 1m"),
        "{stderr}"
    );
    // Review finding: kube's parser panicked on this one.
    let absurd = "99999999999999999999h";
    let stderr = fails(&cli(&home, &["queues", "--request-timeout", absurd]), 2);
    assert!(
        stderr.contains(&format!("\"{absurd}\" is too long a duration")),
        "{stderr}"
    );
    let stderr = fails(&cli(&home, &["explain"]), 2);
    assert!(stderr.contains("<POD>"), "{stderr}");
    let stderr = fails(&cli(&home, &["queues", "-o", "wide"]), 2);
    assert!(
        stderr.contains("invalid value 'wide' for '--output <OUTPUT>'"),
        "{stderr}"
    );
}
