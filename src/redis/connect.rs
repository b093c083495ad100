//! The one connection of a Redis limiter, to a server or a Redis Cluster, made lazily.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::error::RedisLimiterError;
use super::script::Conn;

/// How many requests the connection queues before a sender must wait (the client's default
/// is 50).
const PIPELINE_BUFFER: usize = 4_096;

/// The one connection of a limiter (shared by its clones): lazy, so building succeeds while
/// Redis is down; it reconnects by itself.
pub(crate) fn connect(
    url: &str,
    response_timeout: Duration,
) -> Result<ConnectionManager, RedisLimiterError> {
    let client = redis::Client::open(url).map_err(RedisLimiterError::Client)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(response_timeout))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(500))
        // Requests wait in the client's bounded queue once it is full, and are then sent in an
        // order of their own: room for this many keeps the order in which they were asked.
        .set_pipeline_buffer_size(PIPELINE_BUFFER);
    client
        .get_connection_manager_lazy(config)
        .map_err(RedisLimiterError::Client)
}

/// Where a builder's limiter keeps its quotas: one Redis server, or a Redis Cluster reached
/// through some of its nodes.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    Url(String),
    Cluster(Vec<String>),
}

impl Target {
    pub(crate) fn cluster(nodes: &[&str]) -> Target {
        Target::Cluster(nodes.iter().map(|&n| n.to_owned()).collect())
    }

    /// The limiter's one connection, lazy either way.
    pub(crate) fn connect(&self, response_timeout: Duration) -> Result<Conn, RedisLimiterError> {
        match self {
            Target::Url(url) => connect(url, response_timeout).map(Conn::Single),
            Target::Cluster(nodes) => connect_cluster(nodes, response_timeout).map(Conn::Cluster),
        }
    }
}

/// A lazy connection to a Redis Cluster: the client connects to the nodes in the background
/// and learns the slots' masters from the first that answers; it follows redirections and,
/// after a failover, refreshes the slots by itself. Every request (its retries and
/// redirections included) is bounded by `response_timeout`, after which it is an outage.
fn connect_cluster(
    nodes: &[String],
    response_timeout: Duration,
) -> Result<redis::cluster_async::ClusterConnection, RedisLimiterError> {
    if nodes.is_empty() {
        return Err(RedisLimiterError::Client(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a Redis Cluster needs at least one node",
        ))));
    }
    let client = redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
        .connection_timeout(response_timeout)
        .response_timeout(response_timeout)
        .overall_response_timeout(Some(response_timeout))
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .build()
        .map_err(RedisLimiterError::Client)?;
    Ok(client.get_pending_async_connection_with_config(redis::cluster::ClusterConfig::default()))
}
