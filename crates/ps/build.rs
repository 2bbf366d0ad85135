//! Compiles `proto/ps.proto` with protox (a protobuf compiler in Rust), so building needs no
//! system `protoc`; tonic-prost-build turns the descriptors into the messages and services.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/ps.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
