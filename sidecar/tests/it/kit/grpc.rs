//! gRPC without protoc: hand-written prost messages and a prost codec for
//! tonic's generic client (tonic 0.14 moved its own prost codec out into a
//! separate crate, and a codec is a dozen lines).

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

pub const TICKS_PATH: &str = "/kubegrace.test.Ticker/Ticks";

/// `rpc Ticks(TicksRequest) returns (stream Tick)`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TicksRequest {
    /// How many ticks to stream.
    #[prost(uint32, tag = "1")]
    pub count: u32,
    /// Pause before each tick.
    #[prost(uint32, tag = "2")]
    pub interval_ms: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Tick {
    #[prost(uint32, tag = "1")]
    pub seq: u32,
}

/// Encodes `E`, decodes `D`.
pub struct ProstCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for ProstCodec<E, D> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<E, D> Codec for ProstCodec<E, D>
where
    E: prost::Message + Send + 'static,
    D: prost::Message + Default + Send + 'static,
{
    type Encode = E;
    type Decode = D;
    type Encoder = ProstEncoder<E>;
    type Decoder = ProstDecoder<D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder(PhantomData)
    }
}

pub struct ProstEncoder<E>(PhantomData<fn(E)>);

impl<E: prost::Message> Encoder for ProstEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

pub struct ProstDecoder<D>(PhantomData<fn() -> D>);

impl<D: prost::Message + Default> Decoder for ProstDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}
