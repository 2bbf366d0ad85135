//! Behaviour tests of parameter-server training: roles as threads over real gRPC, and as
//! real processes (`tessera-ps-role`) for the failure tests.

mod add_server;
mod admission;
mod async_training;
mod config;
mod embedding;
mod faults;
mod gpt;
mod heartbeat;
mod hostile;
mod pod_network;
mod prost_ckpt;
mod protocol;
mod sweep;
mod sync_equivalence;
mod util;
