//! Helpers shared by the integration tests.

#![allow(dead_code)] // each test file uses a different part

pub mod decisions;
pub mod trace;
pub mod world;
