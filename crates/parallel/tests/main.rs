//! Behaviour tests of the parallel pass.

mod rules;
