//! Integration tests of the checkpoint crate, in one binary.

mod attacks;
mod conformance;
mod fuzz;
mod roundtrip;
mod util;
