//! Behaviour tests of the reshard executor: plans executed on the local backend.

mod fused;
mod messages;
mod properties;
