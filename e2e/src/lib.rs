//! End-to-end tests of gpuqueue against a real control plane: etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager v1.36 built from the Go module proxy, with KWOK
//! running fake GPU nodes and pod lifecycles. No Docker.
//!
//! A test starts its own [`ControlPlane`] (a few seconds), which gives it a cluster-admin
//! client, fake GPU nodes and pod IPs on loopback (`127.100.0.0/16`) that it can bind test
//! servers to; dropping the control plane stops exactly its processes.
//!
//! ```no_run
//! # async fn example() -> gpuqueue_e2e::Result<()> {
//! use gpuqueue_e2e::{ControlPlane, ControlPlaneConfig};
//! let cluster = ControlPlane::start(ControlPlaneConfig::new("my_test")).await?;
//! let ns = cluster.namespace("my-test").await?;
//! gpuqueue_e2e::apply_yaml(&cluster.client(), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", Some(ns.name())).await?;
//! # Ok(()) }
//! ```

mod api_writes;
mod apply;
mod binaries;
mod control_plane;
mod cutting_proxy;
mod error;
mod faults;
mod invariants;
mod knobs;
mod kueue;
mod namespace;
mod nodes;
mod pods;
mod process;
mod prometheus;
mod sightings;
mod slot;
mod stages;
mod wait;

pub use api_writes::{ServerMetrics, WebhookCalls, api_requests, api_writes};
pub use apply::{
    FIELD_MANAGER, WriteMode, apply_file, apply_yaml, install_crds, write_file, write_yaml,
    yaml_files,
};
pub use binaries::{BIN_DIR_ENV, bin_dir, repo_root, target_dir, without_crate_env};
pub use control_plane::{
    CONTROLLERS, Component, ControlPlane, ControlPlaneConfig, DetachedCluster, UserAccess,
};
pub use cutting_proxy::CuttingProxy;
pub use error::{Error, Result};
pub use faults::{FaultKind, FaultSchedule, compact_etcd};
pub use invariants::{
    Allowances, AuditTail, AuditedRequest, CheckerConfig, CheckpointCall, Eviction,
    InvariantChecker, InvariantReport, InvariantViolation, QuotaReport, QuotaSampler, Rule,
    SAMPLE_INTERVAL, TenantQuota, Violation, reflect, wall_clock_ms,
};
pub use knobs::{env_number, env_numbers};
pub use kueue::{KUEUE_GATE, KUEUE_NAMESPACE, Kueue, KueueConfig, KueueTenant, QUEUE_NAME_LABEL};
pub use namespace::{TEST_NAMESPACE_LABEL, TempNamespace};
pub use nodes::{GpuNode, H100_MEMORY_MIB, H100_PRODUCT, MIG_1G_10GB, MIG_3G_40GB};
pub use pods::{
    bound_pod, bound_replacement, describe_pod, fake_vllm_on, gpu_pod, has_finished, node_of,
    pod_condition,
};
pub use process::ManagedProcess;
pub use prometheus::{Alert, Prometheus, PrometheusConfig, RuleHealth};
pub use sightings::Sightings;
pub use slot::{SLOTS, free_port, free_ports};
pub use stages::{
    IGNORES_SIGTERM_ANNOTATION, KubeletTiming, NEVER_ENDS_ANNOTATION, NodeBehaviour,
    READY_AFTER_ANNOTATION,
};
pub use wait::{DEFAULT_TIMEOUT, wait_for};
