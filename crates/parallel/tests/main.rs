//! Behaviour tests of the parallel pass.
