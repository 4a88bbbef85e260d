//! `kubectl gpuqueue explain POD`: why a pod waits, or where and as what it was admitted, from
//! what the operator wrote (the pod's annotations, its queue's status, its events).
//!
//! `run` reads, explains, then renders, one module each:
//! - `read`: what is fetched from the cluster (`Observed`), the only part with a client;
//! - `facts`: the pure explanation (`explain`: `Observed` → `Explanation`);
//! - `explanation`: what is told, as data (the shape of `-o json|yaml`);
//! - `text`: the explanation for people.

mod explanation;
mod facts;
#[cfg(test)]
mod fixtures;
mod read;
mod text;

use std::io::Write;

use jiff::Timestamp;

pub use explanation::{Admission, Claim, EventView, Explanation, NodeView, QueuePods, Reclaim};
pub use facts::explain;
pub use read::Observed;
pub use text::render;

use crate::args::ExplainArgs;
use crate::connect::{self, InspectError};

/// Runs `kubectl gpuqueue explain`.
pub fn run(args: &ExplainArgs, now: Timestamp, out: &mut dyn Write) -> Result<(), InspectError> {
    let observed = connect::block_on(read::read(args))?;
    let explanation = explain(&observed, args.events);
    if !crate::render::structured(&explanation, args.output, out)? {
        out.write_all(render(&explanation, now).as_bytes())?;
    }
    Ok(())
}
