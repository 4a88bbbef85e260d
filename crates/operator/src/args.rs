//! The command line. Every flag has an environment variable where a Deployment would set it
//! (`POD_NAMESPACE`, `POD_NAME` from the downward API), and defaults that match `config/`.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args as ClapArgs, Parser, ValueEnum};

use crate::admission::at_creation::DEFAULT_RESERVATIONS_PER_NAMESPACE;

/// gpuqueue-operator: admits GPU pods within their queue's quotas, lends idle GPUs between
/// queues and reports every queue's state on `kubectl get gq`.
#[derive(Parser, Debug, Clone)]
#[command(name = "gpuqueue-operator", version, about, long_about = None)]
pub struct Args {
    /// The operator's own namespace: where its Lease and webhook Service live.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gpuqueue-system")]
    pub namespace: String,

    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub http: HttpArgs,

    #[command(flatten)]
    pub webhook: WebhookArgs,

    #[command(flatten)]
    pub leader: LeaderArgs,

    #[command(flatten)]
    pub admission: AdmissionArgs,

    #[command(flatten)]
    pub log: LogArgs,
}

/// How to reach the API server.
#[derive(ClapArgs, Debug, Clone, Default)]
pub struct KubeArgs {
    /// A kubeconfig file. Without it the operator does what kubectl does: `$KUBECONFIG`,
    /// then `~/.kube/config`, then the in-cluster ServiceAccount.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (default: the current context).
    #[arg(long, requires = "kubeconfig")]
    pub context: Option<String>,
}

/// The plain-HTTP endpoint for Prometheus and the kubelet's probes.
#[derive(ClapArgs, Debug, Clone)]
pub struct HttpArgs {
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "GPUQUEUE_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
}

/// The mutating admission webhook that gates GPU pods, and its certificate.
#[derive(ClapArgs, Debug, Clone)]
pub struct WebhookArgs {
    /// Address the webhook serves TLS on.
    #[arg(long, env = "GPUQUEUE_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,

    /// Name of the Service in front of the webhook; the serving certificate names
    /// `<service>.<namespace>.svc` and `<service>.<namespace>.svc.cluster.local`.
    #[arg(long, default_value = "gpuqueue-webhook")]
    pub webhook_service_name: String,

    /// Extra names (DNS names or IP addresses) the serving certificate is valid for, for a
    /// webhook reached by URL rather than through a Service (a local control plane).
    #[arg(long = "webhook-extra-san", value_name = "NAME_OR_IP")]
    pub webhook_extra_sans: Vec<String>,

    /// The MutatingWebhookConfiguration whose `caBundle` the operator keeps up to date. It is
    /// the only one the operator may patch (RBAC `resourceNames`).
    #[arg(long, default_value = "gpuqueue-operator")]
    pub webhook_config_name: String,

    /// Lifetime of a serving certificate.
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub webhook_cert_validity: Duration,

    /// A serving certificate is replaced this long before it expires.
    #[arg(long, default_value = "8h", value_parser = parse_duration)]
    pub webhook_cert_renew_before: Duration,

    /// Lifetime of the operator's webhook CA. A new CA is published before the old one can no
    /// longer sign a full-length serving certificate.
    #[arg(long, default_value = "720h", value_parser = parse_duration)]
    pub webhook_ca_validity: Duration,

    /// A PEM file of the CA that signs kube-apiserver's webhook client certificate: the webhook
    /// then refuses, in the TLS handshake, every client without a certificate it signed. Give
    /// kube-apiserver that certificate with `--admission-control-config-file` (a
    /// `WebhookAdmissionConfiguration` whose `kubeConfigFile` names it for the webhook's host).
    /// Without it, anyone who reaches the port may call the webhook.
    #[arg(long, env = "GPUQUEUE_WEBHOOK_CLIENT_CA", value_name = "FILE")]
    pub webhook_client_ca: Option<PathBuf>,

    /// After SIGTERM the webhook goes on answering this long, with `/readyz` failing: the API
    /// server learns that a stopping replica left the Service only a moment later, and a call
    /// that finds the port closed creates its pod ungated (`failurePolicy: Ignore`). The
    /// leader's lease is released at once all the same.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub webhook_drain: Duration,
}

/// Leader election on a coordination.k8s.io Lease: one replica acts, the others stand by.
#[derive(ClapArgs, Debug, Clone)]
pub struct LeaderArgs {
    /// Name of the Lease, in the operator's namespace.
    #[arg(long, default_value = "gpuqueue-operator")]
    pub lease_name: String,

    /// This replica's identity in the Lease (default: `$POD_NAME` or the host name, with a
    /// random suffix so that a restarted process is a new holder).
    #[arg(long, env = "POD_NAME")]
    pub lease_identity: Option<String>,

    /// How long a leader's claim lasts without renewal; a standby takes over after it.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// The leader renews this long before its claim runs out, and stops acting half of it
    /// before; it is also the clock skew between replicas the election tolerates.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub lease_grace: Duration,
}

/// The admission loop.
#[derive(ClapArgs, Debug, Clone)]
pub struct AdmissionArgs {
    /// After a change, wait this long for more changes before deciding, so that a burst of
    /// pods is decided in one pass.
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub debounce: Duration,

    /// The longest a steady stream of changes may hold a decision back.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub debounce_max: Duration,

    /// Admit a pod that fits in the webhook, at its creation, while no pod waits (it is pinned
    /// to its node and never gated). `false` gates every managed pod.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub admit_at_creation: bool,

    /// At most this many pods of one namespace admitted at creation that the pod store does not
    /// show yet; beyond it the namespace's new pods go to the gate. A create that fails after
    /// the webhook answered holds its room for 15 s.
    #[arg(long, env = "GPUQUEUE_CREATION_RESERVATIONS_PER_NAMESPACE",
          default_value_t = DEFAULT_RESERVATIONS_PER_NAMESPACE)]
    pub creation_reservations_per_namespace: usize,
}

/// Logs.
#[derive(ClapArgs, Debug, Clone)]
pub struct LogArgs {
    /// Log format: `text` for people, `json` for log collectors.
    #[arg(long, value_enum, env = "GPUQUEUE_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter in tracing's `EnvFilter` syntax, such as `info,gpuqueue_operator=debug`.
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    pub log_filter: String,
}

/// How log lines are written.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Parses a Go-style duration (`500ms`, `15s`, `24h`), the syntax of Kubernetes manifests.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = gpuqueue_api::duration::parse(text).map_err(|error| error.to_string())?;
    if duration.is_negative() {
        return Err(format!(
            "{text} is negative; a duration here must be positive"
        ));
    }
    Ok(duration.into())
}

impl WebhookArgs {
    /// The names the serving certificate must carry: the Service's DNS names, then the extras.
    pub fn certificate_names(&self, namespace: &str) -> Vec<String> {
        let service = &self.webhook_service_name;
        let mut names = vec![
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ];
        names.extend(self.webhook_extra_sans.iter().cloned());
        names
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("gpuqueue-operator").chain(extra.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_match_the_install_manifests() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.http.metrics_addr.port(), 8080);
        assert_eq!(args.webhook.webhook_addr.port(), 9443);
        assert_eq!(args.webhook.webhook_config_name, "gpuqueue-operator");
        assert_eq!(args.leader.lease_name, "gpuqueue-operator");
        assert_eq!(args.leader.lease_duration, Duration::from_secs(15));
        assert_eq!(args.webhook.webhook_cert_validity, Duration::from_hours(24));
        assert_eq!(args.admission.debounce, Duration::from_millis(10));
        assert_eq!(args.log.log_format, LogFormat::Text);
    }

    #[test]
    fn durations_use_the_kubernetes_syntax() {
        let args = parse(&["--lease-duration", "1m30s", "--debounce", "250ms"]).unwrap();
        assert_eq!(args.leader.lease_duration, Duration::from_secs(90));
        assert_eq!(args.admission.debounce, Duration::from_millis(250));
    }

    #[test]
    fn a_bad_duration_is_refused_with_the_flag_named() {
        let error = parse(&["--lease-duration", "fifteen"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--lease-duration"), "{error}");
        let error = parse(&["--debounce=-5ms"]).unwrap_err().to_string();
        assert!(error.contains("negative"), "{error}");
    }

    #[test]
    fn a_context_needs_a_kubeconfig() {
        assert!(parse(&["--context", "kind-dev"]).is_err());
        let args = parse(&["--kubeconfig", "/tmp/kc", "--context", "kind-dev"]).unwrap();
        assert_eq!(args.kube.context.as_deref(), Some("kind-dev"));
    }

    #[test]
    fn the_certificate_names_the_service_and_the_extras() {
        let args = parse(&["--webhook-extra-san", "127.0.0.1"]).unwrap();
        assert_eq!(
            args.webhook.certificate_names("ops"),
            [
                "gpuqueue-webhook.ops.svc",
                "gpuqueue-webhook.ops.svc.cluster.local",
                "127.0.0.1"
            ]
        );
    }

    #[test]
    fn json_logs_are_selectable() {
        let args = parse(&["--log-format", "json"]).unwrap();
        assert_eq!(args.log.log_format, LogFormat::Json);
        assert!(parse(&["--log-format", "xml"]).is_err());
    }
}
