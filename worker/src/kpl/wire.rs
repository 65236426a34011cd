//! The messages of `worker/proto/kpl.proto`, written out with prost's derive.
//!
//! Why a hand mirror and not prost-build: the format is three small messages frozen since 2015, and
//! prost-build needs a `protoc` binary (or a pure-Rust compiler such as protox) at every build. A mirror
//! needs neither, adds no build script, and is checked where it matters: the tests decode aggregates made
//! by AWS's own library, which is generated from the published .proto.
//!
//! The `required` fields of the .proto are `Option` here, because prost does not enforce `required`:
//! absence must be seen to be refused, as protobuf-java (and so the Java KCL) refuses it.

use bytes::Bytes;

/// `message Tag`: the KCL ignores tags, and so do we, but they must parse.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Tag {
    /// `required string key = 1`.
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    /// `optional string value = 2`.
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `message Record`: one user record.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Record {
    /// `required uint64 partition_key_index = 1`.
    #[prost(uint64, optional, tag = "1")]
    pub partition_key_index: Option<u64>,
    /// `optional uint64 explicit_hash_key_index = 2`.
    #[prost(uint64, optional, tag = "2")]
    pub explicit_hash_key_index: Option<u64>,
    /// `required bytes data = 3`.
    #[prost(bytes = "bytes", optional, tag = "3")]
    pub data: Option<Bytes>,
    /// `repeated Tag tags = 4`.
    #[prost(message, repeated, tag = "4")]
    pub tags: Vec<Tag>,
}

/// `message AggregatedRecord`: the key tables and the user records.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AggregatedRecord {
    /// `repeated string partition_key_table = 1`.
    #[prost(string, repeated, tag = "1")]
    pub partition_key_table: Vec<String>,
    /// `repeated string explicit_hash_key_table = 2`.
    #[prost(string, repeated, tag = "2")]
    pub explicit_hash_key_table: Vec<String>,
    /// `repeated Record records = 3`.
    #[prost(message, repeated, tag = "3")]
    pub records: Vec<Record>,
}
