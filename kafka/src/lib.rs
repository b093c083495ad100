//! A real Kafka consumer paced by paced: rdkafka against a tansu broker. The tests, the example
//! `kafka_pipeline` and the consumer process `paced-consumer` share what is here.

pub mod broker;
pub mod pipeline;

pub use broker::Broker;

/// The guide's Kafka sample (`src/guide/kafka_consumer.md`), compiled here as a doctest: paced's
/// own doctests have no rdkafka.
#[doc = include_str!("../../src/guide/kafka_consumer.md")]
#[cfg(doctest)]
pub struct GuideSample;
