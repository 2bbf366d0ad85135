//! Behaviour tests of the reshard engine: plans executed on the local backend.

mod messages;
mod properties;
