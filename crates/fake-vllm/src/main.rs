//! `fake-vllm`: serves the fake vLLM on one or more addresses, with an optional admin listener.
//! SIGTERM or Ctrl-C shuts down as vLLM does with `--shutdown-timeout`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gpuqueue_fake_vllm::{Config, Fleet, RouteFault, fleet_router};
use tokio::net::TcpListener;

/// A fake vLLM server faithful to vLLM's routes, bodies and metrics, with injectable faults.
#[derive(Debug, Parser)]
#[command(name = "fake-vllm", version)]
struct Args {
    /// Address to serve, such as a KWOK pod's 127.100.0.7:8000; repeat for several, each with
    /// its own state.
    #[arg(long, required = true)]
    listen: Vec<SocketAddr>,

    /// Admin listener: `/_fake/servers` (list, add, remove) and `/_fake/servers/{addr}/...`.
    #[arg(long)]
    admin: Option<SocketAddr>,

    /// Fault on every server from the start: ROUTE=SPEC, SPEC a comma list of delay:DURATION,
    /// status:CODE, hang, close, times:N; ROUTE a path such as /pause, or * for all routes.
    #[arg(long = "fault", value_name = "ROUTE=SPEC")]
    faults: Vec<RouteFault>,

    /// Seconds in-flight requests get after SIGTERM before they are aborted (vLLM's flag).
    #[arg(long, default_value_t = 0)]
    shutdown_timeout: u64,

    #[command(flatten)]
    config: Config,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("fake-vllm: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let fleet = Fleet::new(args.config, args.faults);
    for addr in &args.listen {
        fleet
            .add(*addr)
            .await
            .map_err(|error| format!("cannot listen on {addr}: {error}"))?;
    }
    if let Some(addr) = args.admin {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|error| format!("cannot listen on admin address {addr}: {error}"))?;
        let router = fleet_router(fleet.clone());
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, router).await {
                tracing::error!(%error, "admin listener failed");
            }
        });
        tracing::info!(%addr, "admin listening");
    }
    // Scripts wait for this line before they call the servers.
    println!(
        "fake-vllm ready: {}",
        args.listen
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );

    terminated().await;
    let drain = Duration::from_secs(args.shutdown_timeout);
    let servers = fleet.servers();
    for server in &servers {
        server.shutdown(drain);
    }
    for server in &servers {
        server.exited().await;
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
async fn terminated() {
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
