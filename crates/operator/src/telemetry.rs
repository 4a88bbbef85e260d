//! Structured logs with `tracing`: human-readable text by default, one JSON object per line for
//! log collectors. The filter uses `EnvFilter` syntax (`info,gpuqueue_operator=debug`).

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::args::{LogArgs, LogFormat};

/// Why logging could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("--log-filter {filter:?} is not a valid filter: {source}")]
    Filter {
        filter: String,
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("a global logger is already installed: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// Parses the log filter, naming the flag when it is invalid.
pub fn filter(args: &LogArgs) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::try_new(&args.log_filter).map_err(|source| TelemetryError::Filter {
        filter: args.log_filter.clone(),
        source,
    })
}

/// Installs the global subscriber for the process.
pub fn init(args: &LogArgs) -> Result<(), TelemetryError> {
    let filter = filter(args)?;
    let registry = tracing_subscriber::registry().with(filter);
    match args.log_format {
        LogFormat::Text => registry.with(fmt::layer().with_target(true)).try_init()?,
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .try_init()?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(filter: &str) -> LogArgs {
        LogArgs {
            log_format: LogFormat::Json,
            log_filter: filter.to_owned(),
        }
    }

    #[test]
    fn a_valid_filter_parses() {
        let filter = filter(&args("info,gpuqueue_operator=debug,kube=warn")).unwrap();
        assert!(filter.to_string().contains("gpuqueue_operator=debug"));
    }

    #[test]
    fn an_invalid_filter_names_the_flag_and_the_text() {
        let error = filter(&args("info,=[")).unwrap_err().to_string();
        assert!(error.contains("--log-filter"), "{error}");
        assert!(error.contains("info,=["), "{error}");
    }
}
