//! Codecs the file formats share: the protobuf wire format ([`wire`]) of MindSpore's `.ckpt`,
//! strategy and group-info files, and order-preserving JSON ([`json`]) of the JSON files.
//! They know bytes and syntax only, no format's schema.

pub(crate) mod json;
pub(crate) mod wire;
