//! Behaviour tests of the layout crate: properties over random layouts and conformance with
//! MindSpore's `Layout` (case0 of the reference cases).

mod conformance;
mod properties;
