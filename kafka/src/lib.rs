//! A real Kafka consumer paced by paced: rdkafka against a tansu broker. The tests, the example
//! `kafka_pipeline` and the consumer process `paced-consumer` share what is here.

pub mod broker;
pub mod pipeline;

pub use broker::Broker;
