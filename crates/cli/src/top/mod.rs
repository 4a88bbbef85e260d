//! `kubectl gpuqueue top`: per node and GPU resource, what is allocated, what is free, how much
//! of the free capacity is fragmented by the core's measure, and which queues hold the GPUs;
//! then the cluster in one line.
//!
//! `run` reads, measures, then renders, one module each:
//! - `read`: nodes, pods, namespaces and queues, the only part with a client;
//! - `pools`: the pure report (`Objects` → `PoolReport`), the core's snapshot read back;
//! - `text`: the report for people.

pub mod pools;
mod read;
pub mod text;

use std::io::Write;

use crate::args::TopArgs;
use crate::connect::{self, InspectError};
use crate::render;

/// Runs `kubectl gpuqueue top`.
pub fn run(args: &TopArgs, out: &mut dyn Write) -> Result<(), InspectError> {
    let objects = connect::block_on(async {
        let cluster = connect::connect(&args.cluster).await?;
        read::read(cluster.client).await
    })?;
    let report = pools::report(&objects);
    if !render::structured(&report, args.output, out)? {
        out.write_all(text::render(&report).as_bytes())?;
    }
    Ok(())
}
