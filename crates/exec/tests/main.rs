//! Behaviour tests of the executor and the optimizers: sharded programs against one device,
//! ops under random strategies, the optimizers' update rules.

mod accumulation;
mod bias_grad;
mod epilogue;
mod equivalence;
mod moved_buffers;
mod op_sharding;
mod optimizer;
mod sharded;
mod sharded_cross_entropy;
mod sharded_embedding;
mod sharded_reshape;
