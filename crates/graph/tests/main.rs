//! Behaviour tests of the graph crate: shape inference, every op's gradient against finite
//! differences, whole models, the executor, and global semantics under sharding.

mod alloc;
mod composite;
mod executor;
mod gradients;
mod models;
mod pieces;
mod shapes;
mod sharding;
mod util;
