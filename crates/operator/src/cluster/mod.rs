//! Stage 1, on every replica: watch events into reflector stores, with the writes the stores
//! have not shown yet ([`assumed`]) and the debounce of their change signals.

pub mod assumed;
pub mod debounce;
pub mod devices;
pub mod metrics;
mod slim;
pub mod stores;
#[cfg(test)]
pub(crate) mod testing;
