//! Behaviour tests of the runtime.

mod equivalence;
